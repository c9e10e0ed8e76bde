"""The power cap: a closed loop on max clocks that keeps the board under ``[dvfs] power_cap_w``.

On every telemetry sample (the sampler's board power, never a read of its own):

- over the cap: the biggest consumer's max frequency goes down **one table step** below the
  frequency it runs at now (a step above that would change nothing), through
  :meth:`ProfileManager.set_cap` (journaled: stop and crash recovery restore the board);
- at least ``power_cap_hysteresis_w`` under the cap for ``RAISE_AFTER`` samples in a row: the
  last step is undone, provided the power that step saved (measured on the sample after it)
  still fits under the cap with the hysteresis to spare, so a raise does not bounce right
  back over the cap;
- nothing left to lower: one ``power_cap.saturated`` event (the static draw is over the cap).

Which consumer is "biggest" is an estimate, since boards rarely have a rail per device (the
Orin NX's VDD_CPU_GPU_CV feeds both): dynamic power grows with f x V^2, roughly f^2 across a
DVFS table, times the number of cores, so a device scores ``weight x (f / f_max)^2`` with
weight = its online CPUs for a cpufreq policy, :data:`DEVICE_WEIGHT` for a GPU/NPU devfreq
device (memory buses are not touched). The step goes to the highest score, which spreads the
cap over the devices that run fastest for their range.

Each step is a ``power_cap.step`` event (MQTT ``events``); :meth:`PowerCap.status` is shown in
telemetry (``power_cap``), ``status`` and ``GET /v1/profile``. Profiles applied while a cap is
in force (thermal fallbacks, SLO picks, operators) stay under it (see edgepilot.dvfs.caps).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgepilot.dvfs.caps import limit_files
from edgepilot.errors import EdgepilotError
from edgepilot.events import Event, EventBus

if TYPE_CHECKING:
    from edgepilot.dvfs.manager import ProfileManager

log = logging.getLogger(__name__)

RAISE_AFTER = 3
# a devfreq GPU counts as four cores, an NPU as two (cpufreq policies: their online CPUs)
DEVICE_WEIGHT = {"gpu": 4.0, "npu": 2.0}


@dataclass
class Step:
    """One step down, kept until it is undone (last in, first out)."""

    device: str
    path: str           # the device directory (board path)
    unit: str
    before: int         # max limit before the step
    after: int          # max limit after it
    power_w: float      # board power that made us step
    saved_w: float | None = None   # power on the sample before minus the one after


@dataclass
class Candidate:
    """A device whose max frequency the cap may lower."""

    name: str
    directory: Path
    unit: str
    table: tuple[int, ...]   # ascending
    limit: int               # its max limit now
    running: int             # the frequency it runs at (capped by the limit)
    top: int                 # highest table entry
    weight: float

    @property
    def score(self) -> float:
        return self.weight * (self.running / self.top) ** 2 if self.top else 0.0

    def next_down(self) -> int | None:
        """The table entry just below the frequency it runs at (None at the bottom)."""
        lower = [f for f in self.table if f < self.running]
        return lower[-1] if lower else None


class PowerCap:
    """Decides and makes the cap's steps for one ProfileManager.

    :meth:`check` is blocking (sysfs reads, maybe a journaled write): call it from a worker
    thread with each new sample's ``power_w``. ``cap_w``/``hysteresis_w`` are read on every
    check, so a config reload takes effect on the next sample.
    """

    def __init__(self, manager: ProfileManager, events: EventBus,
                 cap_w: Callable[[], float | None], hysteresis_w: Callable[[], float]) -> None:
        self.manager = manager
        self.events = events
        self.cap_w = cap_w
        self.hysteresis_w = hysteresis_w
        self.paused: str | None = None     # why the loop holds still (e.g. SLO measuring)
        self.steps: list[Step] = []
        self._below = 0
        self._saturated = False
        self._no_power = False
        self._power_w: float | None = None
        self._last: dict[str, Any] | None = None
        self._closed = False
        self._state_lock = threading.Lock()

    def close(self) -> None:
        """No more steps (the daemon is stopping; restore follows)."""
        with self.manager.lock:
            self._closed = True

    # ---- decisions --------------------------------------------------------------------------
    def check(self, power_w: float | None) -> Event | None:
        """One decision on one sample; returns the event of a step (or of saturation)."""
        if self.paused is not None:  # without waiting for the lock the pauser may hold
            return None
        with self.manager.lock:
            if self._closed or self.paused is not None:
                return None
            cap = self.cap_w()
            if not self.manager.caps.caps and self.steps:
                # a restore (operator, profile.restore) put the board back as found: the loop
                # starts over from there
                with self._state_lock:
                    self.steps.clear()
            if cap is None:
                return self._lift_all()
            self._no_power = power_w is None
            if power_w is None:
                return None
            with self._state_lock:
                self._power_w = power_w
                if self.steps and self.steps[-1].saved_w is None:
                    self.steps[-1].saved_w = round(self.steps[-1].power_w - power_w, 6)
            if power_w > cap:
                self._below = 0
                return self._step_down(power_w, cap)
            self._saturated = False
            if not self.steps or power_w > cap - self.hysteresis_w():
                self._below = 0
                return None
            self._below += 1
            if self._below < RAISE_AFTER:
                return None
            return self._step_up(power_w, cap)

    def candidates(self) -> list[Candidate]:
        """Online cpufreq policies and GPU/NPU devfreq devices with a frequency table."""
        out = []
        board = self.manager.board
        cpus = board.cpus_online()
        for pol in board.policies():
            if not pol.online or not pol.frequencies or pol.max_khz is None:
                continue
            online = sum(1 for c in pol.cpus if cpus.get(c, True)) or 1
            out.append(_candidate(pol.name, pol.path, pol.frequencies, pol.max_khz,
                                  pol.cur_khz, float(online)))
        for dev in board.devfreq():
            if dev.kind not in DEVICE_WEIGHT or not dev.frequencies or dev.max_hz is None:
                continue
            out.append(_candidate(dev.name, dev.path, dev.frequencies, dev.max_hz, dev.cur_hz,
                                  DEVICE_WEIGHT[dev.kind]))
        return out

    def _step_down(self, power_w: float, cap: float) -> Event | None:
        choices = [c for c in self.candidates() if c.next_down() is not None]
        if not choices:
            if self._saturated:
                return None
            self._saturated = True
            log.warning("power cap %.2f W: board at %.2f W with every clock at its floor",
                        cap, power_w)
            return self.events.emit("power_cap.saturated", power_w=power_w, cap_w=cap)
        best = max(choices, key=lambda c: (c.score, c.weight, c.name))
        target = best.next_down()
        assert target is not None
        try:
            self.manager.set_cap(best.directory, target)
        except EdgepilotError as exc:
            log.error("power cap step on %s failed (undone): %s", best.name, exc.message)
            return self.events.emit("power_cap.failed", device=best.name, message=exc.message)
        step = Step(best.name, self.manager.board.fs.rel(best.directory), best.unit,
                    best.limit, target, power_w)
        with self._state_lock:
            self.steps.append(step)
        return self._emit("down", step, power_w, cap)

    def _step_up(self, power_w: float, cap: float) -> Event | None:
        step = self.steps[-1]
        if step.saved_w is not None and power_w + max(step.saved_w, 0.0) \
                > cap - self.hysteresis_w():
            return None  # undoing it would bring the board back over the cap
        self._below = 0
        directory = self.manager.board.fs.path(step.path)
        uncapped = self.manager.caps.uncapped_max(directory)
        try:
            self.manager.set_cap(directory, None if uncapped is None
                                 or step.before >= uncapped else step.before)
        except EdgepilotError as exc:
            log.error("power cap raise on %s failed (undone): %s", step.device, exc.message)
            return self.events.emit("power_cap.failed", device=step.device, message=exc.message)
        with self._state_lock:
            self.steps.pop()
        return self._emit("up", step, power_w, cap)

    def _lift_all(self) -> Event | None:
        """The cap was removed from the config: every step is undone at once."""
        if not self.steps and not self.manager.caps.caps:
            return None
        for rel in list(self.manager.caps.caps):
            try:
                self.manager.set_cap(self.manager.board.fs.path(rel), None)
            except EdgepilotError as exc:
                log.error("lifting the power cap on %s failed: %s", rel, exc.message)
        with self._state_lock:
            self.steps.clear()
        return self.events.emit("power_cap.off")

    def _emit(self, direction: str, step: Step, power_w: float, cap: float) -> Event:
        frm, to = (step.before, step.after) if direction == "down" else (step.after, step.before)
        fields = {"direction": direction, "device": step.device, "from": frm, "to": to,
                  "unit": step.unit, "power_w": power_w, "cap_w": cap,
                  "steps": len(self.steps)}
        with self._state_lock:
            self._last = dict(fields)
        log.info("power cap %.2f W at %.2f W: %s %s %s -> %s %s", cap, power_w, direction,
                 step.device, frm, to, step.unit)
        return self.events.emit("power_cap.step", **fields)

    # ---- reporting ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Plain data for telemetry (``power_cap``), ``status`` and ``GET /v1/profile``."""
        cap = self.cap_w()
        with self._state_lock:
            steps = [asdict(s) for s in self.steps]
            last = dict(self._last) if self._last else None
            power = self._power_w
        if cap is None:
            state = "off"
        elif self.paused is not None:
            state = "paused"
        elif self._no_power:
            state = "no_power_sensor"
        elif self._saturated:
            state = "saturated"
        else:
            state = "capping" if steps else "under"
        return {"cap_w": cap, "hysteresis_w": self.hysteresis_w(), "state": state,
                "paused": self.paused, "power_w": power, "steps": steps,
                "caps": self.manager.caps.state(), "last_step": last}


def _candidate(name: str, directory: Path, table: tuple[int, ...], limit: int,
               cur: int | None, weight: float) -> Candidate:
    running = min(cur, limit) if cur else limit
    return Candidate(name, directory, limit_files(directory)[2], table, limit, running,
                     table[-1], weight)
