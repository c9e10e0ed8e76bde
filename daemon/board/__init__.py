"""edgepilot.board"""
