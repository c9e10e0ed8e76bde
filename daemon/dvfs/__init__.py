"""edgepilot.dvfs"""
