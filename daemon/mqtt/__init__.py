"""edgepilot.mqtt"""
