"""edgepilot.telemetry"""
