"""Which board this is: device-tree model/compatible, and the family that picks profile files."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgepilot.board.sysfs import Sysfs

GENERIC = "generic"

# family -> compatible strings (exact, or prefix when ending in "*") that identify it.
FAMILY_COMPATIBLE: dict[str, tuple[str, ...]] = {
    "jetson-orin": ("nvidia,tegra234", "nvidia,p3767*", "nvidia,p3701*"),
    "snapdragon-8gen3": ("qcom,sm8650", "qcom,pineapple"),
    "dimensity-9300": ("mediatek,mt6989",),
}


@dataclass(frozen=True)
class BoardIdentity:
    """Device-tree identity; ``family`` is "generic" when no known family matched."""

    model: str | None
    compatible: tuple[str, ...]
    family: str = GENERIC
    matched_by: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "compatible": list(self.compatible), "family": self.family,
                "matched_by": self.matched_by}


def compatible_matches(patterns: tuple[str, ...] | list[str], compatible: tuple[str, ...]) -> bool:
    """True when any compatible string equals a pattern (or starts with a ``prefix*`` one)."""
    for pat in patterns:
        for comp in compatible:
            if (pat.endswith("*") and comp.startswith(pat[:-1])) or comp == pat:
                return True
    return False


def _fingerprint(fs: Sysfs) -> tuple[str, str] | None:
    """Families recognised without a device tree (Android kernels may not expose one).

    Adreno 750 is only in SM8650; the MT6989 is the SoC with gpufreqv2 and a 3.25 GHz prime core.
    """
    gpu_model = fs.read_str(fs.path("/sys/class/kgsl/kgsl-3d0/gpu_model")) or ""
    if gpu_model.startswith("Adreno750"):
        return "snapdragon-8gen3", "kgsl gpu_model Adreno750"
    if fs.path("/proc/gpufreqv2/gpufreq_status").exists():
        prime = fs.read_int(fs.path("/sys/devices/system/cpu/cpufreq/policy7/cpuinfo_max_freq"))
        if prime == 3250000:
            return "dimensity-9300", "gpufreqv2 + 3.25 GHz policy7"
    return None


def read_identity(fs: Sysfs) -> BoardIdentity:
    """Read ``/proc/device-tree/{model,compatible}``; fall back to fingerprints, else generic."""
    raw = fs.read_text(fs.path("/proc/device-tree/compatible"))
    if raw is None:
        raw = fs.read_text(fs.path("/sys/firmware/devicetree/base/compatible"))
    compatible = tuple(s for s in (raw or "").split("\x00") if s.strip())
    model_raw = fs.read_text(fs.path("/proc/device-tree/model"))
    if model_raw is None:
        model_raw = fs.read_text(fs.path("/sys/firmware/devicetree/base/model"))
    model = (model_raw or "").strip("\x00\n ") or None
    for family, patterns in FAMILY_COMPATIBLE.items():
        if compatible_matches(patterns, compatible):
            return BoardIdentity(model, compatible, family, "compatible")
    found = _fingerprint(fs)
    if found is not None:
        return BoardIdentity(model, compatible, found[0], found[1])
    return BoardIdentity(model, compatible, GENERIC, None)
