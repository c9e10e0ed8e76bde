"""CPU frequency policies, discovered from ``cpufreq/policy*`` (never a hard-coded layout)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepilot.board.sysfs import Sysfs

CPU_DIR = "/sys/devices/system/cpu"
_POLICY_RE = re.compile(r"^policy(\d+)$")


@dataclass(frozen=True)
class Policy:
    """One cpufreq policy (a cluster). Frequencies in kHz; None = unreadable right now."""

    name: str                      # directory name, e.g. "policy4"
    path: Path
    cpus: tuple[int, ...]          # related_cpus
    online: bool
    governors: tuple[str, ...]     # scaling_available_governors
    frequencies: tuple[int, ...]   # scaling_available_frequencies, ascending (empty = no table)
    governor: str | None
    cur_khz: int | None
    min_khz: int | None
    max_khz: int | None
    hw_min_khz: int | None         # cpuinfo_min_freq
    hw_max_khz: int | None         # cpuinfo_max_freq

    @property
    def number(self) -> int:
        return int(self.name.removeprefix("policy"))

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def range_khz(self) -> tuple[int, int] | None:
        """Lowest and highest frequency this policy can run at (table, else cpuinfo)."""
        if self.frequencies:
            return self.frequencies[0], self.frequencies[-1]
        if self.hw_min_khz is not None and self.hw_max_khz is not None:
            return self.hw_min_khz, self.hw_max_khz
        return None

    def sample(self) -> dict[str, Any]:
        return {"cpus": list(self.cpus), "governor": self.governor, "cur_khz": self.cur_khz,
                "min_khz": self.min_khz, "max_khz": self.max_khz, "online": self.online}


def parse_cpu_list(text: str | None) -> list[int]:
    """Parse "0-3,5" or "0 1 2 3" into a list of CPU numbers."""
    cpus: list[int] = []
    for part in re.split(r"[,\s]+", (text or "").strip()):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus


def cpu_online(fs: Sysfs, cpu: int) -> bool:
    """cpuN/online, else the global online list; cpu0 often has no online file (always on)."""
    value = fs.read_int(fs.path(f"{CPU_DIR}/cpu{cpu}/online"))
    if value is not None:
        return value == 1
    online = fs.read_str(fs.path(f"{CPU_DIR}/online"))
    if online is not None:
        try:
            return cpu in parse_cpu_list(online)
        except ValueError:
            pass
    return True


def online_cpus(fs: Sysfs) -> dict[int, bool]:
    """Every present CPU (from cpuN directories) -> online."""
    base = fs.path(CPU_DIR)
    result: dict[int, bool] = {}
    if base.is_dir():
        for entry in base.iterdir():
            m = re.match(r"^cpu(\d+)$", entry.name)
            if m:
                result[int(m.group(1))] = cpu_online(fs, int(m.group(1)))
    return dict(sorted(result.items()))


def read_policy(fs: Sysfs, path: Path) -> Policy:
    """Read one policy; files that fail (EBUSY while offline) become None/empty."""
    try:
        cpus = tuple(parse_cpu_list(fs.read_str(path / "related_cpus")))
    except ValueError:
        cpus = ()
    online = any(cpu_online(fs, c) for c in cpus) if cpus else True
    table = fs.read_ints(path / "scaling_available_frequencies") or []
    return Policy(
        name=path.name, path=path, cpus=cpus, online=online,
        governors=tuple(fs.read_words(path / "scaling_available_governors") or ()),
        frequencies=tuple(sorted(set(table))),
        governor=fs.read_str(path / "scaling_governor"),
        cur_khz=fs.read_int(path / "scaling_cur_freq"),
        min_khz=fs.read_int(path / "scaling_min_freq"),
        max_khz=fs.read_int(path / "scaling_max_freq"),
        hw_min_khz=fs.read_int(path / "cpuinfo_min_freq"),
        hw_max_khz=fs.read_int(path / "cpuinfo_max_freq"),
    )


def discover_policies(fs: Sysfs) -> list[Policy]:
    """All ``policy*`` directories, ordered by number."""
    base = fs.path(f"{CPU_DIR}/cpufreq")
    if not base.is_dir():
        return []
    found = [(int(m.group(1)), e) for e in base.iterdir() if (m := _POLICY_RE.match(e.name))]
    return [read_policy(fs, path) for _, path in sorted(found)]
