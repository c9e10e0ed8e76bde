"""The telemetry sampler: board power, energy, clocks and temperatures, plus served work.

Every ``[telemetry] sample_interval_s`` the board is read off the loop (sysfs reads block), power
is integrated into energy and thermal zones are checked; every ``publish_interval_s`` a report
with a persistent ``seq`` is built and handed to listeners (MQTT). Missing sensors are absent
fields, never zeros. The sampler keeps going whatever a sensor or a listener does.

It fills the :class:`~edgepilot.telemetry.power_history.PowerHistory` the
:class:`~edgepilot.telemetry.work.WorkMeter` reads one request's energy from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil

from edgepilot.blocking import RunBlocking
from edgepilot.board.board import Board, BoardSample
from edgepilot.config import ConfigSource
from edgepilot.events import EventBus
from edgepilot.readiness import Readiness
from edgepilot.telemetry.apportion import Apportioned, apportion
from edgepilot.telemetry.power_history import PowerHistory, power_points
from edgepilot.telemetry.seq import SEQ_FILE, PersistentSeq
from edgepilot.telemetry.thermal_warn import ThermalWarner
from edgepilot.telemetry.work import WorkMeter, WorkStats

log = logging.getLogger(__name__)

Report = dict[str, Any]
Listener = Callable[[Report], None]
Extra = Callable[[], Mapping[str, Any]]

# the board's energy_j is its raw energy counters (RAPL), ours is the integral of power_w
_RENAMED = {"energy_j": "board_energy_j"}
_SKIPPED = ("ts",)
__all__ = ["ActiveProfile", "RawSample", "TelemetrySampler", "power_points"]


@dataclass(frozen=True)
class RawSample:
    """What one blocking read returns; turned into a sample dict on the loop."""

    board: BoardSample | None
    board_error: str | None
    cpu_util_pct: float
    mem_used_pct: float
    mem_available_mb: float


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, (dict, list)) and not value)


class ActiveProfile(Protocol):
    """The DVFS profile manager, as telemetry sees it: each sample names the profile in force."""

    active_name: str | None


class TelemetrySampler:
    """A Service: samples on a period, publishes reports on a longer one.

    Public surface: :meth:`latest` (last sample), :meth:`snapshot` (what ``GET /v1/telemetry``
    and the ``telemetry.get`` command return), :meth:`add_listener` (called with every report),
    :meth:`add_extra` (fields merged into every report, e.g. MQTT's ``dropped``).
    """

    name = "telemetry"

    def __init__(self, *, config: ConfigSource, board: Board | None,
                 profiles: ActiveProfile | None, work: WorkMeter, power: PowerHistory,
                 events: EventBus, readiness: Readiness, run_blocking: RunBlocking,
                 state_dir: Path) -> None:
        """``power``: where board power goes (the work meter reads requests' energy there)."""
        self.config = config
        self.board = board
        self.profiles = profiles
        self.work = work
        self.power = power
        self.energy = power.energy
        self.readiness = readiness
        self.run_blocking = run_blocking
        self.seq = PersistentSeq(state_dir / SEQ_FILE)
        self._listeners: list[Listener] = []
        self._extras: list[Extra] = []
        self._latest: dict[str, Any] = {}
        self._last_report: Report | None = None
        self._thermal = ThermalWarner(events.emit)
        self._board_error: str | None = None
        self._window_t: float | None = None
        self._window_energy = 0.0
        self._window_sample_t: float | None = None  # first power sample of the open window
        self._task: asyncio.Task[None] | None = None
        # the board's thermal trip points, read once (static in practice; a thermal daemon
        # that rewrites them is seen on restart)
        self._trips: dict[str, list[dict[str, Any]]] | None = None

    # ---- wiring -----------------------------------------------------------------------------
    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(report)`` on the daemon loop for every report; it must not block."""
        self._listeners.append(fn)

    def add_extra(self, fn: Extra) -> None:
        """Merge ``fn()`` into every report and snapshot (top-level keys)."""
        self._extras.append(fn)

    # ---- sampling ---------------------------------------------------------------------------
    def read(self) -> RawSample:
        """Blocking: read the board and psutil once (run it off the loop)."""
        board = self.board
        sample = None
        error = None
        if board is not None:
            try:
                sample = board.sample()
            except Exception as exc:  # a sensor fault must not stop telemetry
                error = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
        mem = psutil.virtual_memory()
        return RawSample(board=sample, board_error=error,
                         cpu_util_pct=float(psutil.cpu_percent(interval=None)),
                         mem_used_pct=float(mem.percent),
                         mem_available_mb=round(mem.available / 1e6, 1))

    def ingest(self, raw: RawSample, now: float | None = None) -> dict[str, Any]:
        """Integrate energy, check thermal limits, store the sample taken at monotonic ``now``."""
        t = time.monotonic() if now is None else now
        if raw.board_error != self._board_error:
            if raw.board_error:
                log.warning("board sample failed (telemetry continues without it): %s",
                            raw.board_error)
            self._board_error = raw.board_error
        out: dict[str, Any] = {"ts": round(time.time(), 3)}
        power = raw.board.power_w if raw.board is not None else None
        self.power.add(t, power)
        if raw.board is not None:
            for key, value in raw.board.as_dict().items():
                if key not in _SKIPPED and _present(value):
                    out[_RENAMED.get(key, key)] = value
        if self.energy.started:
            out["energy_j"] = round(self.energy.energy_j, 6)
        profile = self.profiles.active_name if self.profiles is not None else None
        if profile is not None:
            out["profile"] = profile
        out["cpu_util_pct"] = raw.cpu_util_pct
        out["mem_used_pct"] = raw.mem_used_pct
        out["mem_available_mb"] = raw.mem_available_mb
        if raw.board is not None:
            cfg = self.config().telemetry
            self._thermal.check(raw.board.temps_c, cfg.thermal_warn_c, cfg.thermal_hysteresis_c)
        if self._window_t is None:
            self._window_t, self._window_energy = t, self.energy.energy_j
        self._latest = out
        return out

    def sample_now(self, now: float | None = None) -> dict[str, Any]:
        """Read and ingest one sample synchronously (tests and one-shot CLI use)."""
        return self.ingest(self.read(), now)

    def trips(self) -> dict[str, list[dict[str, Any]]]:
        """Thermal trip points per zone (``{"type", "temp_c"}``, coolest first), read once."""
        if self._trips is None:
            try:
                self._trips = dict(self.board.thermal_trips()) if self.board is not None else {}
            except Exception as exc:  # a sensor fault must not stop telemetry
                log.warning("thermal trip points unreadable (%s: %s); shown without them",
                            type(exc).__name__, exc)
                self._trips = {}
        return self._trips

    # ---- reports ----------------------------------------------------------------------------
    def _apportion(self, since: float | None) -> Apportioned | None:
        """The energy of the power samples from ``since`` on, split between models by the time
        their requests ran (None without a power sensor)."""
        if not self.energy.started:
            return None
        samples = self.power.since(since)
        if len(samples) < 2:
            return Apportioned()
        busy = self.work.intervals(samples[0][0], samples[-1][0])
        return apportion(samples, busy)

    def _models(self, window_s: float, shares: Apportioned | None,
                now: float) -> dict[str, dict[str, Any]]:
        stats: dict[str, WorkStats] = self.work.window(window_s, now=now)
        out: dict[str, dict[str, Any]] = {}
        for name, s in stats.items():
            m: dict[str, Any] = {
                "requests": s.requests, "requests_total": s.requests_total,
                "errors_total": s.errors_total, "tokens": s.tokens,
                "tokens_total": s.tokens_total,
                "inferences_per_s": round(s.inferences_per_s, 4),
                "tokens_per_s": round(s.tokens_per_s, 4)}
            if s.plan is not None:
                m["plan"] = s.plan
            if s.latency_p50_ms is not None:
                m["latency_p50_ms"] = round(s.latency_p50_ms, 3)
            if s.latency_p95_ms is not None:
                m["latency_p95_ms"] = round(s.latency_p95_ms, 3)
            if s.latency_p99_ms is not None:
                m["latency_p99_ms"] = round(s.latency_p99_ms, 3)
            if s.energy_total_j is not None:
                # since start: the sum of the energy_j its answers carried (a counter)
                m["energy_total_j"] = round(s.energy_total_j, 6)
            m["busy_s"] = round(s.busy_s, 6)
            # this model's share of the window's energy (the board's power while its requests
            # ran, shared with concurrent ones), per unit of its work; idle energy is not in it
            energy_j = shares.models_j.get(name, 0.0) if shares is not None else 0.0
            if energy_j > 0.0:
                m["energy_j"] = round(energy_j, 6)
                if s.requests:
                    m["energy_per_inference_j"] = round(energy_j / s.requests, 6)
                if s.tokens:
                    m["energy_per_token_j"] = round(energy_j / s.tokens, 6)
            out[name] = m
        return out

    def _extras_dict(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for fn in self._extras:
            try:
                merged.update(fn())
            except Exception:
                log.exception("telemetry extra %r failed", fn)
        return merged

    def report(self, now: float | None = None) -> Report:
        """Close the current window: build a report with the next ``seq``; notify listeners."""
        t = time.monotonic() if now is None else now
        start = self._window_t if self._window_t is not None else t
        window_s = max(t - start, 1e-6)
        energy = self.energy.energy_j - self._window_energy if self.energy.started else None
        msg: Report = {"seq": self.seq.next(), **self._latest}
        msg["ts"] = round(time.time(), 3)
        msg["window_s"] = round(window_s, 3)
        shares = self._apportion(self._window_sample_t)
        if energy is not None:
            msg["window_energy_j"] = round(energy, 6)
        if shares is not None:
            msg["idle_energy_j"] = round(shares.idle_j, 6)
        msg["models"] = self._models(window_s, shares, t)
        msg.update(self._extras_dict())
        self._window_t, self._window_energy = t, self.energy.energy_j
        self._close_power_window(t)
        self._last_report = msg
        for fn in list(self._listeners):
            try:
                fn(msg)
            except Exception:  # one broken listener must not stop the others or the sampler
                log.exception("telemetry listener %r failed", fn)
        return msg

    def _close_power_window(self, now: float) -> None:
        # the next window starts at the last sample (the integrator's window does too); keep
        # what a snapshot over the trailing publish period needs, drop the rest
        if self.power.samples:
            self._window_sample_t = self.power.samples[-1][0]
        keep_from = min(self._window_sample_t or now,
                        now - 2 * self.config().telemetry.publish_interval_s)
        oldest = self.work.oldest_in_flight()
        if oldest is not None:  # a long generation still running is attributed over all of it
            keep_from = min(keep_from, oldest)
        self.power.forget_before(keep_from)

    def latest(self) -> dict[str, Any]:
        """The last sample (empty before the first)."""
        return dict(self._latest)

    def snapshot(self) -> dict[str, Any]:
        """Latest sample plus work over the publish period so far; ``seq`` = last published.
        Also the thermal trip points (``trips_c``), which reports leave out (they do not
        change)."""
        t = time.monotonic()
        window_s = self.config().telemetry.publish_interval_s
        shares = self._apportion(t - window_s)
        out: dict[str, Any] = {"seq": self.seq.last, **self._latest,
                               "models": self._models(window_s, shares, t)}
        trips = self.trips()
        if trips:
            out["trips_c"] = trips
        out.update(self._extras_dict())
        return out

    # ---- service ----------------------------------------------------------------------------
    async def start(self) -> None:
        psutil.cpu_percent(interval=None)  # prime: the first call has nothing to compare with
        self.ingest(await self.run_blocking(self.read))
        await self.run_blocking(self.trips)  # sysfs reads: off the loop, once
        self._task = asyncio.create_task(self._run(), name="telemetry-sampler")
        self.readiness.set("telemetry", None)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.seq.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_sample = loop.time()
        next_publish = loop.time() + self.config().telemetry.publish_interval_s
        while True:
            cfg = self.config().telemetry  # re-read: SIGHUP may change the periods
            next_sample += cfg.sample_interval_s
            now = loop.time()
            if next_sample < now:  # fell behind (slow sensor, busy box): skip, do not burst
                next_sample = now + cfg.sample_interval_s
            await asyncio.sleep(next_sample - now)
            try:
                raw = await self.run_blocking(self.read)
                self.ingest(raw)
                now = loop.time()
                if now >= next_publish:
                    self.report()
                    next_publish += cfg.publish_interval_s
                    if next_publish < now:
                        next_publish = now + cfg.publish_interval_s
            except RuntimeError as exc:
                # the executor is shut down while the daemon stops
                log.debug("sampler stopping: %s", exc)
                return
            except Exception:
                log.exception("telemetry sample failed; continuing")
