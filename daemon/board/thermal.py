"""Thermal zones by ``type`` (zone numbering differs between boots and boards)."""

from __future__ import annotations

import re
from pathlib import Path

from edgepilot.board.sysfs import Sysfs

THERMAL_CLASS = "/sys/class/thermal"
_ZONE = re.compile(r"^thermal_zone(\d+)$")


def zone_dirs(fs: Sysfs) -> list[Path]:
    base = fs.path(THERMAL_CLASS)
    if not base.is_dir():
        return []
    found = [(int(m.group(1)), e) for e in base.iterdir() if (m := _ZONE.match(e.name))]
    return [e for _, e in sorted(found)]


def zone_types(fs: Sysfs) -> dict[str, str]:
    """Zone directory name -> type, including zones whose temperature cannot be read now."""
    return {z.name: fs.read_str(z / "type") or z.name for z in zone_dirs(fs)}


def read_temps(fs: Sysfs) -> dict[str, float]:
    """type -> degrees C. Unreadable zones (EAGAIN while power-gated) are left out."""
    temps: dict[str, float] = {}
    for zone in zone_dirs(fs):
        milli = fs.read_int(zone / "temp")
        if milli is None:
            continue
        kind = fs.read_str(zone / "type") or zone.name
        # two zones may share a type; keep both, the later one named by its zone
        key = kind if kind not in temps else f"{kind}@{zone.name}"
        temps[key] = milli / 1000.0
    return temps


def zone_readings(fs: Sysfs) -> list[dict[str, object]]:
    """Every zone with its type and temperature (None while unreadable), for reports."""
    out: list[dict[str, object]] = []
    for zone in zone_dirs(fs):
        milli = fs.read_int(zone / "temp")
        out.append({"zone": zone.name, "type": fs.read_str(zone / "type") or zone.name,
                    "temp_c": None if milli is None else milli / 1000.0})
    return out


_TRIP = re.compile(r"^trip_point_(\d+)_temp$")


def read_trips(fs: Sysfs) -> dict[str, list[dict[str, object]]]:
    """Zone key (as in :func:`read_temps`: its type, ``type@zoneN`` for a repeated type) ->
    its trip points ``{"type": "passive"|"active"|"hot"|"critical"|..., "temp_c"}``, coolest
    first. Unreadable trip points and zones without any are left out."""
    out: dict[str, list[dict[str, object]]] = {}
    for zone in zone_dirs(fs):
        kind = fs.read_str(zone / "type") or zone.name
        key = kind if kind not in out else f"{kind}@{zone.name}"
        try:
            numbers = [m.group(1) for e in zone.iterdir() if (m := _TRIP.match(e.name))]
        except OSError:  # the zone went away (hot-unplugged sensor)
            continue
        trips: list[tuple[float, str]] = []
        for n in numbers:
            milli = fs.read_int(zone / f"trip_point_{n}_temp")
            if milli is not None:
                trips.append((milli / 1000.0, fs.read_str(zone / f"trip_point_{n}_type") or "?"))
        if trips:
            out[key] = [{"type": kind_, "temp_c": temp} for temp, kind_ in sorted(trips)]
    return out
