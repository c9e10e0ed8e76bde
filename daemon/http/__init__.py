"""edgepilot.http"""
