"""edgepilot.dispatch"""
