"""MQTT: telemetry, events and a retained status out; the same commands as HTTP in."""

from edgepilot.mqtt.state_report import spool_info

__all__ = ["spool_info"]
