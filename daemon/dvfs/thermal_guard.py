"""A profile's own thermal limits, enforced.

``[profiles.X.thermal]`` says: while X is active, if a listed zone goes above ``max_c``, apply
``fallback``; go back to X once every listed zone is ``hysteresis`` degrees below ``max_c``. The
:class:`ThermalGuard` makes those decisions on the telemetry sampler's readings (it never reads
the board itself) and applies profiles through the ProfileManager, so every move is a
transaction and is undone by the same journal on stop. Fallbacks chain (a fallback may have its
own limits and fallback); returns go back one step at a time. With ``[dvfs] slo_ms`` set, the
SLO picker may name a cooler profile that still meets the SLO instead of the configured
fallback (``choose_fallback``, see edgepilot.dvfs.slo).

Flapping: a fallback happens on the first hot sample (safety first); a return needs the zones
cooled by the hysteresis *and* ``[dvfs] thermal_dwell_s`` spent on the fallback, so the board
changes profile at most twice per dwell period however fast it heats and cools.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgepilot.dvfs.profiles import ThermalLimits
from edgepilot.errors import EdgepilotError
from edgepilot.events import Event, EventBus

if TYPE_CHECKING:
    from edgepilot.dvfs.manager import ProfileManager

log = logging.getLogger(__name__)
# (hot profile, its configured fallback, profiles on the guard's stack) -> the profile to apply
# instead (None: the configured one); the SLO picker's re-pick
FallbackChooser = Callable[[str, str | None, list[str]], str | None]


def zone_matches(key: str, zones: list[str]) -> bool:
    """Whether a sample's zone key ("type", or "type@thermal_zoneN" for a repeated type) is
    one of ``zones`` (empty = every zone)."""
    return not zones or key.split("@", 1)[0] in zones


def readings(limits: ThermalLimits, temps: Mapping[str, float]) -> list[tuple[str, float]]:
    """The checked zones' temperatures, hottest first (unreadable zones are not in temps)."""
    found = [(z, t) for z, t in temps.items() if zone_matches(z, limits.zones)]
    return sorted(found, key=lambda zt: (-zt[1], zt[0]))


@dataclass
class _Level:
    """One profile on the guard's stack: the configured one at the bottom, fallbacks above."""

    profile: str
    limits: ThermalLimits
    since: float        # monotonic, for the dwell
    since_wall: float   # for status


class ThermalGuard:
    """Decides and applies thermal fallbacks for one ProfileManager.

    :meth:`check` is blocking (it may apply a profile): call it from a worker thread with each
    new sample's ``temps_c``. A profile applied by anyone else (command, HTTP, reload) becomes
    the new base; a restore empties the stack.
    """

    def __init__(self, manager: ProfileManager, events: EventBus,
                 dwell_s: Callable[[], float], clock: Callable[[], float] = time.monotonic,
                 *, choose_fallback: FallbackChooser | None = None) -> None:
        self.manager = manager
        self.choose_fallback = choose_fallback
        self.events = events
        self.dwell_s = dwell_s
        self.clock = clock
        # None while it gets temperatures, else why not (set by the DVFS service)
        self.watching: str | None = "not started"
        self._stack: list[_Level] = []
        self._quiet: set[str] = set()      # hot profiles without a usable fallback, reported
        self._retry_at = 0.0               # after a failed move, not before this
        self._closed = False
        self._state_lock = threading.Lock()

    def close(self) -> None:
        """No more moves (the daemon is stopping; restore follows)."""
        with self.manager.lock:
            self._closed = True

    # ---- decisions ------------------------------------------------------------------------
    def check(self, temps: Mapping[str, float]) -> Event | None:
        """One decision on one sample; returns the ``thermal`` event of a move (or attempt)."""
        with self.manager.lock:  # nobody applies between our decision and our move
            if self._closed:
                return None
            self._sync()
            if not self._stack:
                return None
            now = self.clock()
            top = self._stack[-1]
            hot = [(z, t) for z, t in readings(top.limits, temps)
                   if top.limits.max_c is not None and t > top.limits.max_c]
            if hot:
                return self._fall_back(top, hot[0], now)
            self._quiet.discard(top.profile)
            if len(self._stack) > 1:
                return self._maybe_return(temps, now)
            return None

    def _sync(self) -> None:
        active = self.manager.active_name
        if self._stack and self._stack[-1].profile == active:
            return
        # somebody else changed the profile (or restored): theirs is the new base
        with self._state_lock:
            self._stack = [] if active is None else [self._level(active, self.clock())]
        self._quiet.clear()
        self._retry_at = 0.0

    def _level(self, name: str, now: float) -> _Level:
        try:
            limits = self.manager.get(name).spec.thermal
        except EdgepilotError as exc:  # profile files edited since: no limits to enforce
            log.warning("thermal limits of profile %s unavailable: %s", name, exc.message)
            limits = ThermalLimits()
        return _Level(name, limits, now, time.time())

    def _fall_back(self, top: _Level, hot: tuple[str, float], now: float) -> Event | None:
        zone, temp = hot
        lim = top.limits
        target = lim.fallback
        fields: dict[str, Any] = {"zone": zone, "temp_c": temp, "threshold_c": lim.max_c,
                                  "state": "hot", "profile": top.profile}
        chooser = self.choose_fallback  # the SLO picker's re-pick, when configured
        if chooser is not None and top.profile not in self._quiet and now >= self._retry_at:
            picked = chooser(top.profile, lim.fallback, [lv.profile for lv in self._stack])
            if picked is not None and picked != lim.fallback:
                target = picked
                fields["chosen_by"] = "slo"
        if target is None or any(lv.profile == target for lv in self._stack):
            if top.profile not in self._quiet:  # once per hot spell, not every sample
                self._quiet.add(top.profile)
                log.warning("thermal: %s at %.1f C is above %s's max_c %.1f and the profile "
                            "has no fallback to apply", zone, temp, top.profile, lim.max_c)
                return self.events.emit("thermal", **fields, action="none",
                                         reason="no fallback profile")
            return None
        if now < self._retry_at:
            return None
        try:
            self.manager.apply(target, reason="thermal")
        except EdgepilotError as exc:
            self._retry_at = now + self.dwell_s()
            log.error("thermal: fallback %s -> %s failed (board rolled back): %s",
                      top.profile, target, exc.message)
            return self.events.emit("thermal", **fields, action="fallback_failed",
                                    fallback=target, message=exc.message)
        with self._state_lock:
            self._stack.append(self._level(target, now))
        log.warning("thermal: %s at %.1f C > %.1f C: %s -> %s", zone, temp, lim.max_c,
                    top.profile, target)
        return self.events.emit("thermal", **fields, action="fallback", fallback=target)

    def _maybe_return(self, temps: Mapping[str, float], now: float) -> Event | None:
        top, below = self._stack[-1], self._stack[-2]
        lim = below.limits
        checked = readings(lim, temps)
        if not checked or lim.max_c is None:
            return None  # nothing says it is cool
        zone, temp = checked[0]
        limit = lim.max_c - lim.hysteresis
        if temp > limit or now - top.since < self.dwell_s() or now < self._retry_at:
            return None
        fields: dict[str, Any] = {"zone": zone, "temp_c": temp, "threshold_c": limit,
                                  "state": "normal", "profile": below.profile,
                                  "fallback": top.profile}
        try:
            self.manager.apply(below.profile, reason="thermal")
        except EdgepilotError as exc:
            self._retry_at = now + self.dwell_s()
            log.error("thermal: return %s -> %s failed (board rolled back): %s",
                      top.profile, below.profile, exc.message)
            return self.events.emit("thermal", **fields, action="return_failed",
                                    message=exc.message)
        with self._state_lock:
            self._stack.pop()
        log.info("thermal: %s at %.1f C <= %.1f C: back to %s", zone, temp, limit,
                 below.profile)
        return self.events.emit("thermal", **fields, action="return")

    # ---- reporting ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Plain data for ``profile status`` / ``GET /v1/profile``."""
        with self._state_lock:
            stack = list(self._stack)
        top = stack[-1] if stack else None
        return {
            "watching": self.watching is None,
            "not_watching": self.watching,
            "base": stack[0].profile if stack else None,
            "fallbacks": [lv.profile for lv in stack[1:]],
            "since": top.since_wall if top is not None and len(stack) > 1 else None,
            "limits": top.limits.model_dump() if top is not None else None,
            "dwell_s": self.dwell_s(),
        }
