"""Telemetry as Prometheus metrics: a custom collector over the sampler's latest data.

Collected at scrape time from what the sampler already holds, so scraping costs no sysfs reads
and the numbers are exactly the ones MQTT publishes. Registered on ``daemon.metrics`` only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from edgepilot.telemetry.sampler import TelemetrySampler

_MODEL_GAUGES = (
    ("inferences_per_s", "edgepilot_model_inferences_per_second",
     "Inferences per second over the last publish window"),
    ("tokens_per_s", "edgepilot_model_tokens_per_second",
     "Generated tokens per second over the last publish window"),
    ("latency_p50_ms", "edgepilot_model_latency_p50_seconds", "Median request latency"),
    ("latency_p95_ms", "edgepilot_model_latency_p95_seconds", "95th percentile request latency"),
    ("latency_p99_ms", "edgepilot_model_latency_p99_seconds", "99th percentile request latency"),
    ("energy_j", "edgepilot_model_window_energy_joules",
     "Board energy while this model's requests ran (shared with concurrent ones), last window"),
    ("busy_s", "edgepilot_model_busy_seconds",
     "Sum of this model's request latencies over the last publish window"),
    ("energy_per_inference_j", "edgepilot_model_energy_per_inference_joules",
     "This model's share of the window's energy per inference (idle energy excluded)"),
    ("energy_per_token_j", "edgepilot_model_energy_per_token_joules",
     "This model's share of the window's energy per generated token (idle energy excluded)"),
)
_MODEL_COUNTERS = (
    ("requests_total", "edgepilot_model_requests", "Requests served"),
    ("errors_total", "edgepilot_model_errors", "Requests failed"),
    ("tokens_total", "edgepilot_model_tokens", "Tokens generated"),
    # exposed as edgepilot_model_energy_joules_total: the sum of the energy_j the model's
    # answers carried (absent without a power sensor)
    ("energy_total_j", "edgepilot_model_energy_joules",
     "Energy attributed to this model's requests since the daemon started"),
)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _freq_items(section: Any) -> Iterator[tuple[str, str, float]]:
    """(name, key, value) for every numeric field of every entry in a cpu/devfreq mapping."""
    if not isinstance(section, Mapping):
        return
    for name, entry in section.items():
        if isinstance(entry, Mapping):
            for key, value in entry.items():
                num = _num(value)
                if num is not None:
                    yield str(name), re.sub(r"[^A-Za-z0-9_]", "_", str(key)), num


class TelemetryCollector(Collector):
    """Exposes the sampler's latest sample and last report as gauges and counters."""

    def __init__(self, sampler: TelemetrySampler) -> None:
        self.sampler = sampler

    def describe(self) -> list[Metric]:
        # no fixed description: families depend on the sensors this board has
        return []

    def collect(self) -> Iterator[Metric]:
        s = self.sampler.latest()
        snap = self.sampler.snapshot()
        yield from self._power(s)
        yield from self._clocks(s)
        util = GaugeMetricFamily("edgepilot_cpu_utilization_ratio", "CPU utilisation, 0..1")
        mem = GaugeMetricFamily("edgepilot_memory_used_ratio", "Memory in use, 0..1")
        if "cpu_util_pct" in s:
            util.add_metric([], s["cpu_util_pct"] / 100.0)
            mem.add_metric([], s["mem_used_pct"] / 100.0)
            yield util
            yield mem
        seq = CounterMetricFamily("edgepilot_telemetry_reports", "Telemetry reports built "
                                  "(the last seq)")
        seq.add_metric([], float(snap.get("seq", 0)))
        yield seq
        for key, name, doc in (("dropped", "edgepilot_mqtt_dropped", "Messages dropped while "
                                "the broker was away (buffer overflow)"),):
            if _num(snap.get(key)) is not None:
                c = CounterMetricFamily(name, doc)
                c.add_metric([], float(snap[key]))
                yield c
        if _num(snap.get("buffered")) is not None:
            g = GaugeMetricFamily("edgepilot_mqtt_buffered", "Messages waiting for the broker")
            g.add_metric([], float(snap["buffered"]))
            yield g
        yield from self._models(snap.get("models") or {})

    def _power(self, s: Mapping[str, Any]) -> Iterator[Metric]:
        if _num(s.get("power_w")) is not None:
            g = GaugeMetricFamily("edgepilot_power_watts", "Total board power")
            g.add_metric([], float(s["power_w"]))
            yield g
        rails = s.get("rails_w")
        if isinstance(rails, Mapping) and rails:
            g = GaugeMetricFamily("edgepilot_rail_power_watts", "Power per rail", labels=["rail"])
            for rail, watts in rails.items():
                if _num(watts) is not None:
                    g.add_metric([str(rail)], float(watts))
            yield g
        if _num(s.get("energy_j")) is not None:
            c = CounterMetricFamily("edgepilot_energy_joules", "Energy since the daemon started "
                                    "(integrated board power)")
            c.add_metric([], float(s["energy_j"]))
            yield c
        temps = s.get("temps_c")
        if isinstance(temps, Mapping) and temps:
            g = GaugeMetricFamily("edgepilot_temperature_celsius", "Thermal zone temperature",
                                  labels=["zone"])
            for zone, temp in temps.items():
                if _num(temp) is not None:
                    g.add_metric([str(zone)], float(temp))
            yield g

    def _clocks(self, s: Mapping[str, Any]) -> Iterator[Metric]:
        for section, metric in (("cpu", "edgepilot_cpufreq"), ("devfreq", "edgepilot_devfreq")):
            families: dict[str, GaugeMetricFamily] = {}
            for name, key, value in _freq_items(s.get(section)):
                fam = families.get(key)
                if fam is None:
                    fam = families[key] = GaugeMetricFamily(
                        f"{metric}_{key}", f"{section} {key} per {section} domain",
                        labels=["domain"])
                fam.add_metric([name], value)
            yield from families.values()

    def _models(self, models: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
        for key, name, doc in _MODEL_GAUGES:
            g = GaugeMetricFamily(name, doc, labels=["model"])
            scale = 1e-3 if key.endswith("_ms") else 1.0
            for model, m in models.items():
                if _num(m.get(key)) is not None:
                    g.add_metric([model], float(m[key]) * scale)
            yield g
        for key, name, doc in _MODEL_COUNTERS:
            c = CounterMetricFamily(name, doc, labels=["model"])
            for model, m in models.items():
                if _num(m.get(key)) is not None:
                    c.add_metric([model], float(m[key]))
            yield c
