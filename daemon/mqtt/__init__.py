"""edgepilot.mqtt"""

from edgepilot.mqtt.state_report import spool_info

__all__ = ["spool_info"]
