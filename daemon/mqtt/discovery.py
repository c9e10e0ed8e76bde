"""Home Assistant MQTT discovery: retained sensor configs for what telemetry carries.

Each sensor reads the telemetry topic with a value template, and uses the retained ``status``
for availability, so Home Assistant shows the board as unavailable when the last will fires.
Sensors appear as telemetry reveals them (a thermal zone, a rail, a model served).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from edgepilot import __version__
from edgepilot.mqtt.outbox import OutMessage
from edgepilot.mqtt.topics import Topics


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:64]


def _sensors(report: Mapping[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """(object_id, name, value_template, extra config) for each sensor the report supports."""
    if "power_w" in report:
        yield ("power", "Power", "{{ value_json.power_w }}",
               {"unit_of_measurement": "W", "device_class": "power",
                "state_class": "measurement"})
    if "energy_j" in report:
        yield ("energy", "Energy", "{{ (value_json.energy_j / 3600) | round(4) }}",
               {"unit_of_measurement": "Wh", "device_class": "energy",
                "state_class": "total_increasing"})
    if "cpu_util_pct" in report:
        yield ("cpu_util", "CPU utilisation", "{{ value_json.cpu_util_pct }}",
               {"unit_of_measurement": "%", "state_class": "measurement"})
    for rail in (report.get("rails_w") or {}):
        yield (f"rail_{_slug(rail)}", f"{rail} power",
               f"{{{{ value_json.rails_w[{json.dumps(rail)}] }}}}",
               {"unit_of_measurement": "W", "device_class": "power",
                "state_class": "measurement"})
    for zone in (report.get("temps_c") or {}):
        yield (f"temp_{_slug(zone)}", f"{zone} temperature",
               f"{{{{ value_json.temps_c[{json.dumps(zone)}] }}}}",
               {"unit_of_measurement": "°C", "device_class": "temperature",
                "state_class": "measurement"})
    for model in (report.get("models") or {}):
        key = json.dumps(model)
        yield (f"model_{_slug(model)}_ips", f"{model} inferences/s",
               f"{{{{ value_json.models[{key}].inferences_per_s }}}}",
               {"unit_of_measurement": "inf/s", "state_class": "measurement"})
        yield (f"model_{_slug(model)}_tps", f"{model} tokens/s",
               f"{{{{ value_json.models[{key}].tokens_per_s }}}}",
               {"unit_of_measurement": "tok/s", "state_class": "measurement"})


class Discovery:
    """Builds discovery configs; remembers which were sent so each goes out once per connect."""

    def __init__(self, topics: Topics, ha_prefix: str, qos: int) -> None:
        self.topics = topics
        self.ha_prefix = ha_prefix
        self.qos = qos
        self.node = _slug(f"edgepilot_{topics.device_id}")
        self._sent: set[str] = set()

    def reset(self) -> None:
        """Send everything again (after a reconnect the broker may have lost retained data)."""
        self._sent.clear()

    def messages(self, report: Mapping[str, Any]) -> list[OutMessage]:
        """Retained config messages for sensors of ``report`` not sent since the last reset."""
        out = []
        device = {"identifiers": [self.node], "name": self.topics.device_id,
                  "manufacturer": "edgepilot", "sw_version": __version__}
        for object_id, name, template, extra in _sensors(report):
            unique = f"{self.node}_{object_id}"
            if unique in self._sent:
                continue
            config = {"name": name, "unique_id": unique, "object_id": unique,
                      "state_topic": self.topics.telemetry, "value_template": template,
                      "availability_topic": self.topics.status,
                      "availability_template": "{{ value_json.state }}",
                      "payload_available": "online", "payload_not_available": "offline",
                      "device": device, **extra}
            topic = f"{self.ha_prefix}/sensor/{self.node}/{object_id}/config"
            out.append(OutMessage(topic=topic, payload=json.dumps(config).encode(),
                                  qos=self.qos, retain=True, spool=False))
            self._sent.add(unique)
        return out
