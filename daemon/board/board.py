"""The Board: identity, discovery, one-shot samples and the few checked writes DVFS needs."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgepilot.board.cpufreq import Policy, discover_policies, online_cpus
from edgepilot.board.devfreq import DevfreqDevice, discover_devfreq
from edgepilot.board.identity import BoardIdentity, read_identity
from edgepilot.board.power import TOTAL_RAIL, read_power
from edgepilot.board.sysfs import Sysfs
from edgepilot.board.thermal import read_temps, read_trips, zone_readings
from edgepilot.errors import BoardError

# min/max file pairs whose order the kernel checks: writing min above max (or max below min)
# fails with EINVAL on devfreq and older cpufreq kernels, so the writer refuses it the same way.
LIMIT_PAIRS: dict[str, str] = {
    "scaling_min_freq": "scaling_max_freq", "scaling_max_freq": "scaling_min_freq",
    "min_freq": "max_freq", "max_freq": "min_freq",
}


@dataclass
class BoardSample:
    """One reading of every sensor and clock. Unreadable values are absent, never an error."""

    ts: float
    rails_w: dict[str, float] = field(default_factory=dict)
    power_w: float | None = None
    power_source: str | None = None
    temps_c: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, dict[str, Any]] = field(default_factory=dict)
    devfreq: dict[str, dict[str, Any]] = field(default_factory=dict)
    energy_j: dict[str, float] = field(default_factory=dict)
    battery_w: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Board:
    """A board below ``sysfs_root`` ("/" on the real machine, a fake tree in tests).

    Reading is safe from any thread; writes happen only through :meth:`write_value` (allow-listed
    names, below the root, kernel ordering rules checked first, read back after).
    """

    def __init__(self, sysfs_root: Path | str = "/") -> None:
        self.fs = Sysfs(sysfs_root)
        self.root = self.fs.root
        self.identity: BoardIdentity = read_identity(self.fs)
        self._rapl_prev: tuple[float, dict[str, float]] | None = None
        self._lock = threading.Lock()

    # ---- discovery -------------------------------------------------------------------------------
    def policies(self) -> list[Policy]:
        """cpufreq policies, read now (governor and limits change under us)."""
        return discover_policies(self.fs)

    def devfreq(self) -> list[DevfreqDevice]:
        """devfreq devices with their kind (gpu/npu/memory/other), read now."""
        return discover_devfreq(self.fs)

    def cpus_online(self) -> dict[int, bool]:
        return online_cpus(self.fs)

    # ---- sampling --------------------------------------------------------------------------------
    def sample(self) -> BoardSample:
        """Read power, temperatures and clocks once; never raises for unreadable files."""
        now = time.monotonic()
        power = read_power(self.fs)
        s = BoardSample(ts=time.time(), rails_w=dict(power.rails_w), temps_c=read_temps(self.fs),
                        energy_j=dict(power.energy_j), battery_w=power.battery_w)
        s.cpu = {p.name: p.sample() for p in self.policies()}
        s.devfreq = {d.name: d.sample() for d in self.devfreq()}
        if TOTAL_RAIL in power.rails_w:
            s.power_w = power.rails_w[TOTAL_RAIL]
            s.power_source = f"{power.rail_sources[TOTAL_RAIL]}:{TOTAL_RAIL}"
        elif power.unreadable:
            # VDD_IN (or a rail of the sum) failed this time: the total is unknown, not the
            # sum of what is left (energy would integrate a drop that never happened)
            pass
        elif power.rails_w:
            s.power_w = sum(power.rails_w.values())
            s.power_source = "sum"
        elif power.battery_w is not None:
            s.power_w = power.battery_w
            s.power_source = "battery"
        elif power.energy_j:
            s.power_w, s.power_source = self._rapl_power(now, power.energy_j), "rapl"
            if s.power_w is None:
                s.power_source = None
        return s

    def thermal_trips(self) -> dict[str, list[dict[str, object]]]:
        """Trip points per thermal zone, keyed like ``BoardSample.temps_c``."""
        return read_trips(self.fs)

    def _rapl_power(self, now: float, energy: dict[str, float]) -> float | None:
        # Package zones only (their children are already inside them); the first sample has no
        # interval yet, and a wrapped counter gives no value for that interval.
        with self._lock:
            prev, self._rapl_prev = self._rapl_prev, (now, energy)
        if prev is None or now <= prev[0]:
            return None
        total = 0.0
        for key, joules in energy.items():
            if not key.startswith("package") or key not in prev[1]:
                continue
            delta = joules - prev[1][key]
            if delta < 0:
                return None
            total += delta
        return total / (now - prev[0])

    # ---- writes ----------------------------------------------------------------------------------
    def read_value(self, path: Path) -> str | None:
        """Exact text of a writable file (for journals: byte-identical restore)."""
        return self.fs.read_text(path)

    def write_value(self, path: Path, text: str) -> None:
        """Write one allow-listed file, check the kernel's min <= max rule first, read back.

        Raises BoardError naming the file and the value on any refusal or failure.
        """
        self.fs.check_writable_path(path)
        partner = LIMIT_PAIRS.get(path.name)
        if partner is not None:
            self._check_limit_order(path, text, path.parent / partner)
        self.fs.write_text(path, text)
        got = self.fs.read_text(path)
        if got is None or got.strip() != text.strip():
            raise BoardError(f"wrote {text.strip()!r} to {self.fs.rel(path)} but it reads back "
                             f"{(got or '').strip()!r}; the kernel or another tool overrode it",
                             field=self.fs.rel(path))

    def _check_limit_order(self, path: Path, text: str, partner: Path) -> None:
        try:
            value = int(text.strip())
        except ValueError:
            raise BoardError(f"EINVAL: {text.strip()!r} is not a frequency for "
                             f"{self.fs.rel(path)}", field=self.fs.rel(path)) from None
        other = self.fs.read_int(partner)
        if other is None:
            return
        is_min = path.name.startswith(("min", "scaling_min"))
        if (is_min and value > other) or (not is_min and value < other):
            rel = "above" if is_min else "below"
            raise BoardError(
                f"EINVAL: writing {value} to {self.fs.rel(path)} would put it {rel} "
                f"{partner.name}={other}; the kernel refuses that (write the other limit first)",
                field=self.fs.rel(path))

    def writable_files(self) -> list[Path]:
        """Every file a profile could write on this board (for doctor and journals)."""
        files: list[Path] = []
        for p in self.policies():
            files += [p.file(n) for n in ("scaling_governor", "scaling_min_freq",
                                          "scaling_max_freq", "scaling_setspeed")
                      if p.file(n).exists()]
        for d in self.devfreq():
            files += [d.file(n) for n in ("governor", "min_freq", "max_freq") if d.file(n).exists()]
        return files

    # ---- report ----------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """JSON-serialisable description of the board for ``doctor`` (which adds the profile
        files that match it: profiles are the DVFS layer's, above this one)."""
        s = self.sample()
        policies = [{
            "name": p.name, "cpus": list(p.cpus), "online": p.online,
            "governor": p.governor, "governors": list(p.governors),
            "frequencies_khz": list(p.frequencies), "min_khz": p.min_khz, "max_khz": p.max_khz,
            "cur_khz": p.cur_khz, "hw_min_khz": p.hw_min_khz, "hw_max_khz": p.hw_max_khz,
        } for p in self.policies()]
        devices = [{
            "name": d.name, "kind": d.kind, "governor": d.governor,
            "governors": list(d.governors), "frequencies_hz": list(d.frequencies),
            "min_hz": d.min_hz, "max_hz": d.max_hz, "cur_hz": d.cur_hz,
        } for d in self.devfreq()]
        return {
            "sysfs_root": str(self.root),
            "identity": self.identity.as_dict(),
            "cpus_online": {str(k): v for k, v in self.cpus_online().items()},
            "policies": policies,
            "devfreq": devices,
            "rails_w": s.rails_w,
            "power_w": s.power_w,
            "power_source": s.power_source,
            "battery_w": s.battery_w,
            "energy_j": s.energy_j,
            "thermal_zones": zone_readings(self.fs),
            "temps_c": s.temps_c,
            "writable": {self.fs.rel(f): self.fs.is_writable(f) for f in self.writable_files()},
        }


def report(sysfs_root: Path | str = "/") -> dict[str, Any]:
    """``Board(sysfs_root).report()``: what doctor prints about the board."""
    return Board(sysfs_root).report()
