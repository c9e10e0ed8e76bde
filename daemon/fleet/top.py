"""`fleet top`: the fleet's live table from the daemons' telemetry, with totals per board kind.

Per device: power, the hottest zone, requests/s (every model), J per inference (the energy the
window's requests were given over their count); per board kind: devices, W, requests/s and J per
inference over all its devices.
"""

from __future__ import annotations

from typing import Any

from edgepilot.fleet.client import Device
from edgepilot.fleet.view import table


def device_load(dev: Device, report: dict[str, Any] | None) -> dict[str, Any]:
    """One device's row from its retained status and its latest telemetry report."""
    board = dev.status.get("board") or {}
    row: dict[str, Any] = {"device_id": dev.device_id, "online": dev.online,
                           "kind": board.get("model") or board.get("family") or "unknown",
                           "profile": dev.status.get("profile"), "power_w": None,
                           "temp_c": None, "requests_per_s": 0.0, "energy_j": 0.0,
                           "requests": 0, "j_per_inference": None}
    if report is None:
        return row
    row["power_w"] = report.get("power_w")
    temps = [t for t in (report.get("temps_c") or {}).values() if isinstance(t, (int, float))]
    row["temp_c"] = max(temps) if temps else None
    row["profile"] = report.get("profile") or row["profile"]
    for m in (report.get("models") or {}).values():
        row["requests_per_s"] += float(m.get("inferences_per_s") or 0.0)
        row["energy_j"] += float(m.get("energy_j") or 0.0)
        row["requests"] += int(m.get("requests") or 0)
    if row["requests"] and row["energy_j"]:
        row["j_per_inference"] = row["energy_j"] / row["requests"]
    return row


def totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per board kind: devices (online), W, requests/s, J per inference."""
    kinds: dict[str, dict[str, Any]] = {}
    for r in rows:
        k = kinds.setdefault(r["kind"], {"kind": r["kind"], "devices": 0, "online": 0,
                                          "power_w": 0.0, "requests_per_s": 0.0,
                                          "energy_j": 0.0, "requests": 0})
        k["devices"] += 1
        k["online"] += int(r["online"])
        k["power_w"] += r["power_w"] or 0.0
        k["requests_per_s"] += r["requests_per_s"]
        k["energy_j"] += r["energy_j"]
        k["requests"] += r["requests"]
    for k in kinds.values():
        k["j_per_inference"] = k["energy_j"] / k["requests"] if k["requests"] else None
    return sorted(kinds.values(), key=lambda k: k["kind"])


def _num(value: float | None, fmt: str) -> str | None:
    return None if value is None else format(value, fmt)


def render_top(rows: list[dict[str, Any]], kinds: list[dict[str, Any]]) -> str:
    out = table(["device", "kind", "profile", "power", "temp", "req/s", "J/inf"],
                ([r["device_id"] + ("" if r["online"] else " (offline)"), r["kind"],
                  r["profile"], _num(r["power_w"], ".2f"), _num(r["temp_c"], ".1f"),
                  _num(r["requests_per_s"], ".1f"), _num(r["j_per_inference"], ".4f")]
                 for r in rows))
    out += "\n" + table(["board kind", "devices", "online", "W", "req/s", "J/inf"],
                        ([k["kind"], k["devices"], k["online"], _num(k["power_w"], ".2f"),
                          _num(k["requests_per_s"], ".1f"), _num(k["j_per_inference"], ".4f")]
                         for k in kinds))
    return out
