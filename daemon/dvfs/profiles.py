"""DVFS profiles as data: TOML files in ``profiles/`` (and ``[dvfs] profile_dirs``).

A file holds ``[match] compatible = [...]`` (optional) and ``[profiles.<name>]`` tables::

    [profiles.balanced]
    description = "..."
    extends = "performance"            # same file first, then generic.toml; "generic:NAME" too
    nvpmodel = 2                       # Jetson power mode id or name
    jetson_clocks = false
    [profiles.balanced.cpu."*"]        # "*", "policyN", "cpuN", "slowest", "fastest"
    governor = ["schedutil", "ondemand"]   # first one the policy offers wins
    min = "min"                        # kHz int, "NN%" of the range, "min", "max" (snapped)
    max = "80%"
    [profiles.balanced.devfreq.gpu]    # "*", "gpu", "npu", "memory", or a devfreq name (Hz)
    governor = "performance"
    [profiles.balanced.thermal]        # enforced while the profile is active
    max_c = 85.0                       # a listed zone above this ...
    zones = ["tj-thermal"]             # (default: every zone)
    fallback = "powersave"             # ... applies this profile
    hysteresis = 5.0                   # back once every zone is 5 C below max_c

``generic.toml`` applies to every board; a family file applies when its stem is the board's
family or its ``compatible`` list matches, and its profiles override generic ones by name.
"""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from edgepilot.board.identity import GENERIC, BoardIdentity, compatible_matches
from edgepilot.errors import ProfileError

FREQ_PATTERN = r"^(min|max|\d{1,3}(\.\d+)?%)$"
CPU_SELECTORS_HELP = '"*", "policyN", "cpuN", "slowest", "fastest"'
DEVFREQ_SELECTORS_HELP = '"*", "gpu", "npu", "memory", or a devfreq device name'

FreqSpec = int | str


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_freq(value: FreqSpec | None) -> FreqSpec | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    if isinstance(value, str) and re.match(FREQ_PATTERN, value):
        if value.endswith("%") and not 0 <= float(value[:-1]) <= 100:
            raise ValueError(f"{value!r}: a percentage must be 0%..100%")
        return value
    raise ValueError(f"{value!r} is not a frequency; allowed: a positive integer (kHz for CPUs, "
                     "Hz for devfreq), \"NN%\" of the range, \"min\" or \"max\"")


class ClockSettings(_Strict):
    """What a profile sets on one CPU policy or devfreq device."""

    governor: str | list[str] | None = Field(
        None, description="Governor, or a fallback list: the first one available is used.")
    min: FreqSpec | None = Field(None, description="Lower limit (snapped to the table).")
    max: FreqSpec | None = Field(None, description="Upper limit (snapped to the table).")
    pin: FreqSpec | None = Field(
        None, description="Fixed frequency: userspace governor when offered, else min = max.")

    @field_validator("min", "max", "pin")
    @classmethod
    def _freqs(cls, value: FreqSpec | None) -> FreqSpec | None:
        return _check_freq(value)

    @property
    def governors(self) -> list[str]:
        if self.governor is None:
            return []
        return [self.governor] if isinstance(self.governor, str) else list(self.governor)


class ThermalLimits(_Strict):
    """Enforced by the daemon's thermal guard (dvfs/thermal_guard.py) while the profile is on."""

    max_c: float | None = Field(None, gt=0, le=150,
                                description="Highest temperature allowed while active.")
    zones: list[str] = Field(default_factory=list,
                             description="Zone types checked (default: every zone).")
    fallback: str | None = Field(None, min_length=1,
                                 description="Profile applied when max_c is exceeded.")
    hysteresis: float = Field(5.0, ge=0, le=50,
                              description="Return from the fallback once every checked zone is "
                              "this many degrees C below max_c.")

    @model_validator(mode="after")
    def _fallback_needs_limit(self) -> ThermalLimits:
        if self.fallback is not None and self.max_c is None:
            raise ValueError("'fallback' needs 'max_c' (the temperature that triggers it)")
        return self


class ProfileSpec(_Strict):
    """One named profile after ``extends`` is resolved."""

    description: str = ""
    extends: str | None = None
    nvpmodel: int | str | None = Field(None, description="Jetson nvpmodel mode id or name.")
    jetson_clocks: bool | None = Field(None, description="Run jetson_clocks (lock clocks at max).")
    cpu: dict[str, ClockSettings] = Field(default_factory=dict)
    devfreq: dict[str, ClockSettings] = Field(default_factory=dict)
    thermal: ThermalLimits = Field(default_factory=ThermalLimits)


class MatchSection(_Strict):
    compatible: list[str] = Field(default_factory=list)


@dataclass
class ProfileFile:
    """One TOML file: its match rules and its raw (unmerged) profile tables."""

    path: Path
    match: MatchSection
    raw: dict[str, dict[str, Any]]

    @property
    def stem(self) -> str:
        return self.path.stem


@dataclass
class Profile:
    """A resolved profile: merged spec plus where it came from."""

    name: str
    spec: ProfileSpec
    source: Path
    chain: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": str(self.source), "extends_chain": self.chain,
                **self.spec.model_dump(exclude_none=True, exclude={"extends"})}


def builtin_dir() -> Path:
    return Path(str(resources.files("edgepilot.profiles")))


def _error(path: Path, exc: ValidationError, prefix: str) -> ProfileError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
    if err["type"] == "extra_forbidden":
        msg = f"{path}: unknown key '{loc}'"
    else:
        msg = f"{path}: '{loc}': {err['msg']}"
    return ProfileError(msg, field=loc)


def load_file(path: Path) -> ProfileFile:
    """Parse one profile file; raise ProfileError naming the file and the key."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile file: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"match", "profiles", "description"})
    if unknown:
        raise ProfileError(f"{path}: unknown top-level key '{unknown[0]}'; allowed: "
                           "description, match, profiles", field=unknown[0])
    try:
        match = MatchSection.model_validate(data.get("match", {}))
    except ValidationError as exc:
        raise _error(path, exc, "match") from None
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        raise ProfileError(f"{path}: 'profiles' must be a table of [profiles.NAME]",
                           field="profiles")
    for name, body in profiles.items():
        if not isinstance(body, dict):
            raise ProfileError(f"{path}: 'profiles.{name}' must be a table",
                               field=f"profiles.{name}")
        try:  # validate each table on its own so errors point at the file that has them
            ProfileSpec.model_validate(body)
        except ValidationError as exc:
            raise _error(path, exc, f"profiles.{name}") from None
    return ProfileFile(path, match, profiles)


def _merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class ProfileStore:
    """Every profile file: ``extra_dirs`` first (they override built-ins of the same name)."""

    def __init__(self, extra_dirs: list[Path] | None = None) -> None:
        self.dirs = [Path(d) for d in (extra_dirs or [])] + [builtin_dir()]

    def files(self) -> dict[str, Path]:
        """stem -> path; the first directory that has a stem wins."""
        found: dict[str, Path] = {}
        for d in self.dirs:
            if d.is_dir():
                for p in sorted(d.glob("*.toml")):
                    found.setdefault(p.stem, p)
        return found

    def matching_files(self, identity: BoardIdentity) -> list[Path]:
        """generic.toml first, then each family file for this board."""
        files = self.files()
        out = [files[GENERIC]] if GENERIC in files else []
        for stem, path in files.items():
            if stem == GENERIC:
                continue
            if stem == identity.family:
                out.append(path)
                continue
            pf = load_file(path)
            if pf.match.compatible and compatible_matches(pf.match.compatible, identity.compatible):
                out.append(path)
        return out

    def for_board(self, identity: BoardIdentity) -> dict[str, Profile]:
        """Resolved profiles usable on this board, by name (family overrides generic)."""
        resolved: dict[str, Profile] = {}
        generic: dict[str, Profile] = {}
        for path in self.matching_files(identity):
            pf = load_file(path)
            layer = self._resolve_file(pf, resolved, generic)
            if pf.stem == GENERIC:
                generic = dict(layer)
            resolved.update(layer)
        return resolved

    def _resolve_file(self, pf: ProfileFile, lower: dict[str, Profile],
                      generic: dict[str, Profile]) -> dict[str, Profile]:
        done: dict[str, Profile] = {}

        def resolve(name: str, stack: list[str]) -> Profile:
            if name in done:
                return done[name]
            if name in stack:
                raise ProfileError(f"{pf.path}: 'profiles.{name}.extends' loops: "
                                   f"{' -> '.join([*stack, name])}",
                                   field=f"profiles.{name}.extends")
            body = pf.raw[name]
            parent_name = body.get("extends")
            base: dict[str, Any] = {}
            chain: list[str] = []
            if parent_name:
                parent = lookup(name, parent_name, [*stack, name])
                base = parent.spec.model_dump(exclude_none=True, exclude={"extends"})
                chain = [parent.name, *parent.chain]
            merged = _merge(base, {k: v for k, v in body.items() if k != "extends"})
            try:
                spec = ProfileSpec.model_validate(merged)
            except ValidationError as exc:
                raise _error(pf.path, exc, f"profiles.{name}") from None
            done[name] = Profile(name, spec, pf.path, chain)
            return done[name]

        def lookup(child: str, ref: str, stack: list[str]) -> Profile:
            if ref.startswith(f"{GENERIC}:"):
                target = ref.split(":", 1)[1]
                if target in generic:
                    return generic[target]
            elif ref in pf.raw and ref != child:
                return resolve(ref, stack)
            elif ref in lower:
                return lower[ref]
            allowed = sorted({*pf.raw, *lower} - {child}) + [f"generic:{n}" for n in generic]
            raise ProfileError(f"{pf.path}: 'profiles.{child}.extends' names unknown profile "
                               f"{ref!r}; allowed: {', '.join(allowed)}",
                               field=f"profiles.{child}.extends")

        for name in pf.raw:
            resolve(name, [])
        return done


def matching_profile_files(identity: BoardIdentity, extra_dirs: list[Path] | None = None
                           ) -> list[Path]:
    """Profile files that apply to a board with this identity (for doctor)."""
    return ProfileStore(extra_dirs).matching_files(identity)
