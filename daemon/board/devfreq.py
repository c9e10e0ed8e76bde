"""devfreq devices (GPU, NPU, memory buses) from ``/sys/class/devfreq/*``."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edgepilot.board.sysfs import Sysfs

DevfreqKind = Literal["gpu", "npu", "memory", "other"]
DEVFREQ_CLASS = "/sys/class/devfreq"

# Names of GPU / NPU / memory-bus devfreq nodes on the boards we know (Jetson 17000000.gpu
# and ga10b/gv11b, Qualcomm KGSL, Mali, Rockchip-style npu nodes, DMC/bus/EMC nodes).
_GPU = re.compile(r"gpu|kgsl|mali|ga10b|gv11b|gp10b|gb10b|adreno|pvr|\.g3d|gpu@")
_NPU = re.compile(r"npu|nvdla|\bdla|apu|rknn|vpu|hexagon|\bnsp|ethos")
_MEM = re.compile(r"dmc|ddr|emc|\bbus|bw|llcc|memlat|cpubw|mem|cci|l3")
# device-tree node names Jetson uses for its GPU (jtop checks of_node/name the same way)
_GPU_OF_NAMES = {"gpu", "gv11b", "gp10b", "ga10b", "gb10b"}


@dataclass(frozen=True)
class DevfreqDevice:
    """One devfreq device. Frequencies in Hz; None = unreadable right now."""

    name: str
    path: Path
    kind: DevfreqKind
    governors: tuple[str, ...]
    frequencies: tuple[int, ...]   # ascending
    governor: str | None
    cur_hz: int | None
    min_hz: int | None
    max_hz: int | None

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def range_hz(self) -> tuple[int, int] | None:
        if self.frequencies:
            return self.frequencies[0], self.frequencies[-1]
        return None

    def sample(self) -> dict[str, Any]:
        return {"kind": self.kind, "governor": self.governor, "cur_hz": self.cur_hz,
                "min_hz": self.min_hz, "max_hz": self.max_hz}


def classify(fs: Sysfs, name: str, path: Path) -> DevfreqKind:
    """GPU / NPU / memory by node name, then by the device-tree node name behind it."""
    low = name.lower()
    if _GPU.search(low):
        return "gpu"
    if _NPU.search(low):
        return "npu"
    of_name = fs.read_str(path / "device" / "of_node" / "name")
    if of_name and of_name.lower() in _GPU_OF_NAMES:
        return "gpu"
    if _MEM.search(low):
        return "memory"
    return "other"


def discover_devfreq(fs: Sysfs) -> list[DevfreqDevice]:
    """Every entry of /sys/class/devfreq, resolved through its symlink, sorted by name."""
    base = fs.path(DEVFREQ_CLASS)
    if not base.is_dir():
        return []
    devices = []
    for entry in sorted(base.iterdir(), key=lambda e: e.name):
        real = Path(os.path.realpath(entry))
        # a link that leaves the root (a broken fake tree) is read through its class name
        path = real if real.is_relative_to(fs.root) else entry
        devices.append(DevfreqDevice(
            name=entry.name, path=path, kind=classify(fs, entry.name, path),
            governors=tuple(fs.read_words(path / "available_governors") or ()),
            frequencies=tuple(sorted(set(fs.read_ints(path / "available_frequencies") or []))),
            governor=fs.read_str(path / "governor"),
            cur_hz=fs.read_int(path / "cur_freq"),
            min_hz=fs.read_int(path / "min_freq"),
            max_hz=fs.read_int(path / "max_freq"),
        ))
    return devices
