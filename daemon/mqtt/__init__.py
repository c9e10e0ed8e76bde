"""edgepilot.mqtt"""

from edgepilot.mqtt.spool import spool_info

__all__ = ["spool_info"]
