"""edgepilot.models"""
