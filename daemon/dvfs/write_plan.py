"""A profile turned into the writes that put it on one board, validated before any write.

:func:`build_plan` resolves a profile against the board into a :class:`WritePlan` (per policy or
devfreq device: governor, min, max, setspeed; the vendor-tool steps); :func:`target_steps` orders
one device's writes so the kernel never sees min > max; :func:`validate_limits` checks a
profile's thermal fallback chain. The ProfileManager runs the steps; nothing here writes.
Frequencies are resolved against each device's own table (ascending or descending on disk,
sorted here), snapped to the nearest entry; governors come from the device's available list.
Every refusal names the profile file, the key and the allowed values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgepilot.board import Board
from edgepilot.board.cpufreq import Policy
from edgepilot.board.sysfs import Sysfs
from edgepilot.board.thermal import zone_types
from edgepilot.dvfs.profiles import (
    CPU_SELECTORS_HELP,
    DEVFREQ_SELECTORS_HELP,
    ClockSettings,
    FreqSpec,
    Profile,
)
from edgepilot.errors import EdgepilotError, ProfileError

KINDS = ("gpu", "npu", "memory", "other")


@dataclass
class TargetPlan:
    """What to set on one policy or devfreq device (None = leave as is)."""

    name: str                  # "policy4" or a devfreq name
    kind: str                  # "cpu" or the devfreq kind
    dir: Path
    governor: str | None = None
    min: int | None = None
    max: int | None = None
    setspeed: int | None = None

    @property
    def files(self) -> tuple[str, str, str, str]:
        """(governor, min, max, setspeed) file names for this kind of device."""
        if self.kind == "cpu":
            return "scaling_governor", "scaling_min_freq", "scaling_max_freq", "scaling_setspeed"
        return "governor", "min_freq", "max_freq", ""

    def as_dict(self) -> dict[str, Any]:
        unit = "khz" if self.kind == "cpu" else "hz"
        d: dict[str, Any] = {"name": self.name, "kind": self.kind, "governor": self.governor,
                             f"min_{unit}": self.min, f"max_{unit}": self.max}
        if self.setspeed is not None:
            d[f"setspeed_{unit}"] = self.setspeed
        return d


@dataclass
class WritePlan:
    """Everything one profile sets on this board: per-device targets and the vendor-tool steps
    (``nvpmodel`` mode id, ``jetson_clocks`` lock); ``skipped`` says what does not apply here."""

    profile: str
    source: Path
    targets: list[TargetPlan] = field(default_factory=list)
    nvpmodel: int | None = None
    jetson_clocks: bool | None = None
    skipped: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "source": str(self.source),
                "nvpmodel": self.nvpmodel, "jetson_clocks": self.jetson_clocks,
                "targets": [t.as_dict() for t in self.targets], "skipped": self.skipped}


def snap(value: int, table: tuple[int, ...]) -> int:
    """Nearest table entry (ties go to the lower one); no table = the value itself."""
    if not table:
        return value
    return min(table, key=lambda f: (abs(f - value), f))


def resolve_freq(spec: FreqSpec, table: tuple[int, ...], rng: tuple[int, int] | None,
                 where: str, unit: str) -> int:
    """kHz/Hz int, "NN%" of the range, "min" or "max" -> a frequency from the table."""
    if rng is None:
        raise ProfileError(f"{where}: this device reports no frequency range, so {spec!r} "
                           "cannot be resolved; remove the key", field=where)
    lo, hi = rng
    if spec == "min":
        return lo
    if spec == "max":
        return hi
    if isinstance(spec, str):
        pct = float(spec.rstrip("%"))
        return snap(round(lo + (hi - lo) * pct / 100), table)
    if not lo <= spec <= hi:
        raise ProfileError(f"{where}: {spec} {unit} is outside this device's range; allowed: "
                           f"{lo}..{hi} {unit}"
                           + (f" (table: {' '.join(map(str, table))})" if table else ""),
                           field=where)
    return snap(spec, table)


def _select_policies(policies: list[Policy], selector: str, where: str) -> list[Policy]:
    if selector == "*":
        return policies
    if selector in ("slowest", "fastest") and policies:
        key = [(p.hw_max_khz or (p.frequencies[-1] if p.frequencies else 0), p.number)
               for p in policies]
        pick = min if selector == "slowest" else max
        return [policies[key.index(pick(key))]]
    if m := re.fullmatch(r"cpu(\d+)", selector):
        return [p for p in policies if int(m.group(1)) in p.cpus][:1] or _none(
            where, selector, [p.name for p in policies])
    if re.fullmatch(r"policy\d+", selector):
        return [p for p in policies if p.name == selector] or _none(
            where, selector, [p.name for p in policies])
    raise ProfileError(f"{where}: unknown CPU selector {selector!r}; allowed: {CPU_SELECTORS_HELP}",
                       field=where)


def _none(where: str, selector: str, names: list[str]) -> list[Any]:
    raise ProfileError(f"{where}: {selector!r} matches nothing on this board; present: "
                       f"{', '.join(names) or 'none'}", field=where)


def _cpu_rank(selector: str) -> int:
    # general selectors first so specific ones override them
    if selector == "*":
        return 0
    if selector in ("slowest", "fastest"):
        return 1
    return 2 if selector.startswith("cpu") else 3


def _settings_for(items: dict[str, ClockSettings], order: list[str]) -> ClockSettings:
    merged: dict[str, Any] = {}
    for sel in order:
        merged.update(items[sel].model_dump(exclude_none=True))
    return ClockSettings.model_validate(merged)


def _fill(tp: TargetPlan, cs: ClockSettings, governors: tuple[str, ...], table: tuple[int, ...],
          rng: tuple[int, int] | None, where: str, unit: str, can_setspeed: bool) -> None:
    if cs.governors:
        chosen = next((g for g in cs.governors if g in governors), None)
        if chosen is None:
            raise ProfileError(
                f"{where}.governor: none of {cs.governors} is available on {tp.name}; "
                f"allowed: {', '.join(governors) or '(none reported)'}", field=f"{where}.governor")
        tp.governor = chosen
    if cs.min is not None:
        tp.min = resolve_freq(cs.min, table, rng, f"{where}.min", unit)
    if cs.max is not None:
        tp.max = resolve_freq(cs.max, table, rng, f"{where}.max", unit)
    if cs.pin is not None:
        value = resolve_freq(cs.pin, table, rng, f"{where}.pin", unit)
        if can_setspeed and "userspace" in governors:
            tp.governor, tp.setspeed = "userspace", value
        else:  # Android/GKI kernels have no userspace governor: pin with min = max
            tp.min = tp.max = value
    if tp.min is not None and tp.max is not None and tp.min > tp.max:
        raise ProfileError(f"{where}: min {tp.min} {unit} is above max {tp.max} {unit}; "
                           "set min <= max", field=f"{where}.min")


def build_plan(profile: Profile, board: Board) -> WritePlan:
    """Validate ``profile`` against ``board`` and return what to write, in no particular order."""
    spec = profile.spec
    src = f"{profile.source}: profiles.{profile.name}"
    plan = WritePlan(profile.name, profile.source)
    policies = board.policies()
    if spec.cpu and not policies:
        raise ProfileError(f"{src}.cpu: this board has no cpufreq policies", field="cpu")
    chosen: dict[str, list[str]] = {}
    for sel in sorted(spec.cpu, key=_cpu_rank):
        for pol in _select_policies(policies, sel, f"{src}.cpu.{sel}"):
            chosen.setdefault(pol.name, []).append(sel)
    for pol in policies:
        if pol.name not in chosen:
            continue
        if not pol.online:
            plan.skipped.append(f"{pol.name}: offline (CPUs {list(pol.cpus)})")
            continue
        cs = _settings_for(spec.cpu, chosen[pol.name])
        tp = TargetPlan(pol.name, "cpu", pol.path)
        where = f"{src}.cpu.{chosen[pol.name][-1]}"
        _fill(tp, cs, pol.governors, pol.frequencies, pol.range_khz, where, "kHz",
              pol.file("scaling_setspeed").exists())
        plan.targets.append(tp)
    devices = board.devfreq()
    for dev in devices:
        sels = [s for s in ("*", dev.kind, dev.name) if s in spec.devfreq]
        if not sels:
            continue
        cs = _settings_for(spec.devfreq, sels)
        tp = TargetPlan(dev.name, dev.kind, dev.path)
        _fill(tp, cs, dev.governors, dev.frequencies, dev.range_hz,
              f"{src}.devfreq.{sels[-1]}", "Hz", False)
        plan.targets.append(tp)
    known = {d.name for d in devices} | {"*", *KINDS}
    for sel in spec.devfreq:
        if sel not in known:
            present = ", ".join(sorted(d.name for d in devices)) or "none present"
            raise ProfileError(f"{src}.devfreq.{sel}: no such devfreq device; allowed: "
                               f"{DEVFREQ_SELECTORS_HELP} ({present})", field=f"devfreq.{sel}")
        if sel in KINDS and not any(d.kind == sel for d in devices):
            plan.skipped.append(f"devfreq.{sel}: no {sel} devfreq device on this board")
    plan.jetson_clocks = spec.jetson_clocks
    if spec.nvpmodel is not None:
        plan.nvpmodel = _nvpmodel_id(spec.nvpmodel, board, f"{src}.nvpmodel")
    return plan


def _nvpmodel_id(mode: int | str, board: Board, where: str) -> int:
    from edgepilot.dvfs.tools import read_nvpmodel_modes

    modes = read_nvpmodel_modes(board.fs)
    if not modes:
        raise ProfileError(f"{where}: this board has no /etc/nvpmodel.conf; nvpmodel profiles "
                           "need a Jetson", field=where)
    for mid, name in modes.items():
        if mode == mid or (isinstance(mode, str) and mode.upper() == name.upper()):
            return mid
    allowed = ", ".join(f"{i} ({n})" for i, n in modes.items())
    raise ProfileError(f"{where}: unknown nvpmodel mode {mode!r}; allowed: {allowed}", field=where)


def validate_limits(profile: Profile, profiles: dict[str, Profile], board: Board) -> None:
    """Refuse limits that could not act on this board: unknown zones, a fallback that does not
    exist, loops or cannot be applied here. Checked before a profile is applied, so a bad
    fallback is found now and not when the board is already hot."""
    present = sorted(set(zone_types(board.fs).values()))
    chain = [profile.name]
    current = profile
    while True:
        lim = current.spec.thermal
        where = f"{current.source}: profiles.{current.name}.thermal"
        unknown = [z for z in lim.zones if z not in present]
        if unknown:
            raise ProfileError(f"{where}.zones: {unknown[0]!r} is not a thermal zone of this "
                               f"board; allowed: {', '.join(present) or 'none (no zones)'}",
                               field="thermal.zones")
        target = lim.fallback
        if target is None:
            return
        if target not in profiles:
            raise ProfileError(f"{where}.fallback: unknown profile {target!r}; allowed: "
                               f"{', '.join(sorted(set(profiles) - {current.name}))}",
                               field="thermal.fallback")
        if target in chain:
            raise ProfileError(f"{where}.fallback: the fallback chain loops: "
                               f"{' -> '.join([*chain, target])}", field="thermal.fallback")
        chain.append(target)
        current = profiles[target]
        try:
            build_plan(current, board)
        except EdgepilotError as exc:
            raise ProfileError(f"{where}.fallback: {target!r} cannot be applied on this board: "
                               f"{exc.message}", field="thermal.fallback") from None


def limit_order(cur_min: int | None, cur_max: int | None, new_min: int | None,
                new_max: int | None) -> list[str]:
    """Which of "min"/"max" to write first so the kernel never sees min > max.

    Raise max before min; lower min before max.
    """
    order: list[str] = []
    if new_max is not None and cur_max is not None and new_max > cur_max:
        order = ["max", "min"]
    else:
        order = ["min", "max"]
    return [o for o in order if (new_min if o == "min" else new_max) is not None]


def target_steps(fs: Sysfs, tp: TargetPlan, baseline: dict[str, str]) -> list[tuple[Path, str]]:
    """The (file, value) writes that put ``tp`` on the board, limits in an order the kernel
    accepts; ``baseline`` is the board as found before any profile (the journal's originals)."""
    gov_f, min_f, max_f, speed_f = tp.files

    def base(name: str) -> int | None:
        text = (baseline.get(fs.rel(tp.dir / name)) or "").strip()
        return int(text) if text.isdigit() else None

    steps: list[tuple[Path, str]] = []
    if tp.governor is not None:
        steps.append((tp.dir / gov_f, tp.governor))
    cur_min = fs.read_int(tp.dir / min_f)
    cur_max = fs.read_int(tp.dir / max_f)
    new_min, new_max = tp.min, tp.max
    # switching profiles: a limit the last profile raised (performance's GPU min = max) must
    # not block this one's cap; the board's own value from before any profile does
    b_min, b_max = base(min_f), base(max_f)
    if new_min is None and new_max is not None and cur_min is not None \
            and new_max < cur_min and b_min is not None and b_min <= new_max:
        new_min = b_min
    if new_max is None and new_min is not None and cur_max is not None \
            and new_min > cur_max and b_max is not None and b_max >= new_min:
        new_max = b_max
    # a lone min above the current max (or max below min) cannot be ordered: refuse early
    if new_max is None and new_min is not None and cur_max is not None and new_min > cur_max:
        raise ProfileError(f"{tp.name}: min {new_min} is above the current max {cur_max} "
                           "and the profile sets no max; add a max", field=f"{tp.name}.min")
    if new_min is None and new_max is not None and cur_min is not None and new_max < cur_min:
        raise ProfileError(f"{tp.name}: max {new_max} is below the current min {cur_min} "
                           "and the profile sets no min; add a min", field=f"{tp.name}.max")
    for which in limit_order(cur_min, cur_max, new_min, new_max):
        steps.append((tp.dir / (min_f if which == "min" else max_f),
                      str(new_min if which == "min" else new_max)))
    if tp.setspeed is not None:
        steps.append((tp.dir / speed_f, str(tp.setspeed)))
    return steps
