"""Work done by the executor, for throughput/latency telemetry and energy per request.

Serving code calls :meth:`WorkMeter.begin` when a request starts and :meth:`WorkMeter.end` when
it finishes (or :meth:`WorkMeter.record` with a latency it measured itself); the telemetry
sampler asks for :meth:`WorkMeter.window` over its publish period. ``end`` returns the energy
attributed to the request: the board's power over its wall time (from the
:class:`~edgepilot.telemetry.power_history.PowerHistory` the sampler fills), shared with the
requests busy at the same moments; None without a power sensor. Thread-safe (inference runs
in workers).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from edgepilot.telemetry.apportion import apportion
from edgepilot.telemetry.power_history import PowerHistory


@dataclass(frozen=True)
class WorkStats:
    """One model's work over a window. Latencies in ms; rates per second."""

    model: str
    requests_total: int
    errors_total: int
    tokens_total: int
    requests: int
    tokens: int
    inferences_per_s: float
    tokens_per_s: float
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    plan: str | None = None
    busy_s: float = 0.0  # sum of the window's request latencies
    latency_p99_ms: float | None = None
    # energy attributed to this model's requests since start (sum of their answers' energy_j);
    # None while no request of it had a power reading to attribute
    energy_total_j: float | None = None


@dataclass
class Request:
    """A request in progress, from :meth:`WorkMeter.begin` to :meth:`WorkMeter.end`."""

    model: str
    started: float  # monotonic s
    id: int = 0
    ended: bool = field(default=False, compare=False)


# keys of apportion()'s busy map when one request's share is wanted (no model name has a NUL)
_SELF, _OTHERS = "\0request", "\0others"


class WorkMeter:
    """Keeps the last ``horizon_s`` seconds of per-request records for every model."""

    def __init__(self, horizon_s: float = 3600.0, max_records: int = 100_000, *,
                 power: PowerHistory | None = None) -> None:
        """``power``: the board's power curve requests' energy is read from (None: energy
        per request is unknown)."""
        # re-entrant: end() holds it while attribute() reads intervals(), so no other
        # request can end (and be seen neither in flight nor finished) in between
        self._lock = threading.RLock()
        self._horizon = horizon_s
        self._records: dict[str, deque[tuple[float, float, int]]] = {}
        self._max = max_records
        self._totals: dict[str, list[int]] = {}  # model -> [requests, errors, tokens]
        self._plans: dict[str, str] = {}  # model -> hash of the plan that served it last
        self._energy: dict[str, float] = {}  # model -> J attributed to its requests
        self._in_flight: dict[int, Request] = {}
        self._ids = itertools.count(1)
        self.power = power

    def record(self, model: str, latency_s: float, tokens: int = 0, *, ok: bool = True,
               plan: str | None = None, now: float | None = None,
               energy_j: float | None = None) -> None:
        """One finished request: its wall latency, for LLMs the tokens generated, the short
        hash of the plan that ran it (so telemetry names the plan behind the numbers) and the
        energy attributed to it, if known."""
        t = time.monotonic() if now is None else now
        with self._lock:
            if plan is not None:
                self._plans[model] = plan
            totals = self._totals.setdefault(model, [0, 0, 0])
            if not ok:
                totals[1] += 1
                return
            totals[0] += 1
            totals[2] += tokens
            if energy_j is not None:
                self._energy[model] = self._energy.get(model, 0.0) + energy_j
            dq = self._records.setdefault(model, deque(maxlen=self._max))
            dq.append((t, latency_s, tokens))
            while dq and dq[0][0] < t - self._horizon:
                dq.popleft()

    def begin(self, model: str, now: float | None = None) -> Request:
        """A request to ``model`` starts: it counts as busy (for energy shares) until
        :meth:`end`. Every ``begin`` must be ended, failure and cancellation included."""
        with self._lock:
            req = Request(model, time.monotonic() if now is None else now, next(self._ids))
            self._in_flight[req.id] = req
            return req

    def oldest_in_flight(self) -> float | None:
        """Start (monotonic s) of the oldest request in progress, None when none is."""
        with self._lock:
            return min((r.started for r in self._in_flight.values()), default=None)

    def end(self, req: Request, tokens: int = 0, *, ok: bool = True, plan: str | None = None,
            now: float | None = None) -> float | None:
        """``req`` finished: record it and return the energy (J) attributed to it.

        The energy is the board's power integrated over the request's wall time, each moment
        shared equally with the other requests busy then (see :mod:`.apportion`); None when
        there is no power sensor, the power was unknown meanwhile, or the request failed
        (a failed request's time is idle time, as in the window's split). A second ``end`` of
        the same request does nothing and returns None.
        """
        t = time.monotonic() if now is None else now
        with self._lock:
            if req.ended:
                return None
            req.ended = True
            self._in_flight.pop(req.id, None)
            energy = self.attribute(req.started, t, exclude=req.id) if ok else None
            self.record(req.model, t - req.started, tokens, ok=ok, plan=plan, now=t,
                        energy_j=energy)
            return energy

    def attribute(self, start: float, end: float, exclude: int | None = None) -> float | None:
        """Energy (J) of one request that ran over monotonic [start, end]: the board's power
        integrated over that time, each moment shared equally with the other requests busy
        then (finished or in flight; ``exclude`` is the request's own in-flight id). None
        without a power sensor or when the power was unknown all that time."""
        points = self.power.curve(start, end) if self.power is not None else None
        if points is None:
            return None
        busy = self.intervals(start, end, exclude=exclude)
        others = [iv for ivs in busy.values() for iv in ivs]
        return apportion(points, {_SELF: [(start, end)], _OTHERS: others}).models_j[_SELF]

    def window(self, window_s: float, now: float | None = None) -> dict[str, WorkStats]:
        """Per-model stats over the last ``window_s`` seconds (models never seen are absent)."""
        t = time.monotonic() if now is None else now
        out: dict[str, WorkStats] = {}
        with self._lock:
            for model, totals in self._totals.items():
                recent = [r for r in self._records.get(model, ()) if r[0] > t - window_s]
                lat = np.array([r[1] for r in recent]) * 1000.0
                energy = self._energy.get(model)
                tokens = sum(r[2] for r in recent)
                out[model] = WorkStats(
                    model=model, requests_total=totals[0], errors_total=totals[1],
                    tokens_total=totals[2], requests=len(recent), tokens=tokens,
                    inferences_per_s=len(recent) / window_s, tokens_per_s=tokens / window_s,
                    latency_p50_ms=float(np.percentile(lat, 50)) if lat.size else None,
                    latency_p95_ms=float(np.percentile(lat, 95)) if lat.size else None,
                    plan=self._plans.get(model),
                    busy_s=float(sum(r[1] for r in recent)),
                    latency_p99_ms=float(np.percentile(lat, 99)) if lat.size else None,
                    energy_total_j=energy)
        return out

    def intervals(self, start: float, end: float, *, exclude: int | None = None
                  ) -> dict[str, list[tuple[float, float]]]:
        """Per model, the (start, end) of each request that ran during [start, end], clipped to
        it (a request is its end time minus its latency; one still in flight runs until
        ``end``); models without any are absent. ``exclude``: the id of an in-flight request
        to leave out."""
        out: dict[str, list[tuple[float, float]]] = {}
        with self._lock:
            for model, records in self._records.items():
                spans = []
                # newest first, stopping at the first that ended before ``start``: records are
                # appended as requests end, so no older one reaches into the range. Every
                # request's energy is attributed through here: it must not scan the horizon.
                for t, lat, _ in reversed(records):
                    if t <= start:
                        break
                    if t - lat < end:
                        spans.append((max(t - lat, start), min(t, end)))
                if spans:
                    out[model] = spans[::-1]
            for rid, req in self._in_flight.items():
                if rid != exclude and req.started < end:
                    out.setdefault(req.model, []).append((max(req.started, start), end))
        return out
