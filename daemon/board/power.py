"""Power sensors: INA3221/INA2xx hwmon rails, power_supply batteries, RAPL energy counters."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from edgepilot.board.sysfs import Sysfs

HWMON_CLASS = "/sys/class/hwmon"
POWER_SUPPLY_CLASS = "/sys/class/power_supply"
POWERCAP_CLASS = "/sys/class/powercap"

# TI INA2xx parts handled by the upstream ina2xx/ina238/ina3221-less drivers: power in uW.
INA2XX_NAMES = frozenset({"ina209", "ina219", "ina220", "ina226", "ina230", "ina231",
                          "ina233", "ina237", "ina238", "ina260"})
_IN_LABEL = re.compile(r"^in(\d+)_label$")
TOTAL_RAIL = "VDD_IN"


@dataclass
class PowerReading:
    """Rails in watts, an optional battery reading and RAPL counters in joules."""

    rails_w: dict[str, float] = field(default_factory=dict)
    rail_sources: dict[str, str] = field(default_factory=dict)   # rail -> "ina3221" ...
    battery_w: float | None = None
    energy_j: dict[str, float] = field(default_factory=dict)
    # labelled rails whose value could not be read this time (EAGAIN, a hwmon gone mid-read):
    # a total made without them would be a different, smaller quantity
    unreadable: list[str] = field(default_factory=list)


def _hwmon_dirs(fs: Sysfs) -> list[Path]:
    base = fs.path(HWMON_CLASS)
    if not base.is_dir():
        return []
    return [e for e in sorted(base.iterdir(), key=lambda e: e.name)]


def read_ina3221(fs: Sysfs, hw: Path, out: PowerReading) -> None:
    """INA3221 on the upstream driver: inN_input mV x currN_input mA per labelled channel.

    Unconnected channels are labelled "NC"; channel 7 ("sum of shunt voltages") is not a rail.
    """
    try:
        entries = sorted(hw.iterdir(), key=lambda e: e.name)
    except OSError:
        # the device went away between discovery and this read (driver unbind, i2c error):
        # its rails are unknown this sample, which makes the total unknown, not smaller
        out.unreadable.append(f"{hw.name}:*")
        return
    for entry in entries:
        m = _IN_LABEL.match(entry.name)
        if not m:
            continue
        label = fs.read_str(entry)
        if not label or label.upper() == "NC" or "NC" in label.split() \
                or "sum of shunt" in label.lower():
            continue
        n = m.group(1)
        mv = fs.read_int(hw / f"in{n}_input")
        ma = fs.read_int(hw / f"curr{n}_input")
        if mv is None or ma is None:
            out.unreadable.append(label)
            continue
        # a rail only draws; a small negative current is shunt-offset noise near zero, and
        # left in it would make the total (and the integrated energy) run backwards
        out.rails_w[label] = max(mv * ma, 0) / 1e6
        out.rail_sources[label] = "ina3221"


def read_ina2xx(fs: Sysfs, hw: Path, name: str, out: PowerReading) -> None:
    """INA2xx: power1_input in uW; the rail is named by in1_label, else chip@device."""
    uw = fs.read_int(hw / "power1_input")
    if uw is None:
        return
    label = fs.read_str(hw / "label") or fs.read_str(hw / "in1_label")
    if not label:
        device = (hw / "device").resolve().name if (hw / "device").exists() else hw.name
        label = f"{name}@{device}"
    out.rails_w[label] = uw / 1e6
    out.rail_sources[label] = name


def read_battery(fs: Sysfs) -> float | None:
    """Battery power in W from current_now (uA) x voltage_now (uV).

    Vendors disagree on the sign of current (negative = discharging on AOSP/QCOM, positive on
    some OEM kernels), so the magnitude is reported.
    """
    base = fs.path(POWER_SUPPLY_CLASS)
    if not base.is_dir():
        return None
    for supply in sorted(base.iterdir(), key=lambda e: e.name):
        if (fs.read_str(supply / "type") or "").lower() != "battery":
            continue
        if (fs.read_str(supply / "status") or "").lower() in ("charging", "full"):
            # on a charger the current is what flows into the battery, not what the SoC
            # draws: the board's draw is unknown, and a gap beats a wrong number
            return None
        power_uw = fs.read_int(supply / "power_now")
        if power_uw is not None:
            return abs(power_uw) / 1e6
        ua = fs.read_int(supply / "current_now")
        uv = fs.read_int(supply / "voltage_now")
        if ua is not None and uv is not None:
            return abs(ua) * uv / 1e12
    return None


def read_rapl(fs: Sysfs) -> dict[str, float]:
    """Cumulative energy counters (J) of powercap zones such as intel-rapl:0 (package-0)."""
    base = fs.path(POWERCAP_CLASS)
    if not base.is_dir():
        return {}
    out: dict[str, float] = {}
    for zone in sorted(base.iterdir(), key=lambda e: e.name):
        uj = fs.read_int(zone / "energy_uj")
        if uj is None:
            continue
        name = fs.read_str(zone / "name") or zone.name
        key = name if name not in out else f"{name}@{zone.name}"
        out[key] = uj / 1e6
    return out


def read_power(fs: Sysfs) -> PowerReading:
    """Every power source on the board, matched by hwmon ``name`` (never by hwmon number)."""
    out = PowerReading()
    for hw in _hwmon_dirs(fs):
        name = (fs.read_str(hw / "name") or "").lower()
        if name == "ina3221":
            read_ina3221(fs, hw, out)
        elif name in INA2XX_NAMES:
            read_ina2xx(fs, hw, name, out)
    out.battery_w = read_battery(fs)
    out.energy_j = read_rapl(fs)
    return out
