"""Work done by the executor, for throughput/latency telemetry.

Serving code calls :meth:`WorkMeter.record` once per finished request; the telemetry sampler asks
for :meth:`WorkMeter.window` over its publish period. Thread-safe (inference runs in workers).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np


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


class WorkMeter:
    """Keeps the last ``horizon_s`` seconds of per-request records for every model."""

    def __init__(self, horizon_s: float = 3600.0, max_records: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._horizon = horizon_s
        self._records: dict[str, deque[tuple[float, float, int]]] = {}
        self._max = max_records
        self._totals: dict[str, list[int]] = {}  # model -> [requests, errors, tokens]
        self._plans: dict[str, str] = {}  # model -> hash of the plan that served it last

    def record(self, model: str, latency_s: float, tokens: int = 0, *, ok: bool = True,
               plan: str | None = None, now: float | None = None) -> None:
        """One finished request: its wall latency, for LLMs the tokens generated, and the short
        hash of the plan that ran it (so telemetry names the plan behind the numbers)."""
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
            dq = self._records.setdefault(model, deque(maxlen=self._max))
            dq.append((t, latency_s, tokens))
            while dq and dq[0][0] < t - self._horizon:
                dq.popleft()

    def window(self, window_s: float, now: float | None = None) -> dict[str, WorkStats]:
        """Per-model stats over the last ``window_s`` seconds (models never seen are absent)."""
        t = time.monotonic() if now is None else now
        out: dict[str, WorkStats] = {}
        with self._lock:
            for model, totals in self._totals.items():
                recent = [r for r in self._records.get(model, ()) if r[0] > t - window_s]
                lat = np.array([r[1] for r in recent]) * 1000.0
                tokens = sum(r[2] for r in recent)
                out[model] = WorkStats(
                    model=model, requests_total=totals[0], errors_total=totals[1],
                    tokens_total=totals[2], requests=len(recent), tokens=tokens,
                    inferences_per_s=len(recent) / window_s, tokens_per_s=tokens / window_s,
                    latency_p50_ms=float(np.percentile(lat, 50)) if lat.size else None,
                    latency_p95_ms=float(np.percentile(lat, 95)) if lat.size else None,
                    plan=self._plans.get(model),
                    busy_s=float(sum(r[1] for r in recent)))
        return out

    def intervals(self, start: float, end: float) -> dict[str, list[tuple[float, float]]]:
        """Per model, the (start, end) of each request that ran during [start, end], clipped to
        it (a request is its end time minus its latency); models without any are absent."""
        out: dict[str, list[tuple[float, float]]] = {}
        with self._lock:
            for model, records in self._records.items():
                spans = [(max(t - lat, start), min(t, end)) for t, lat, _ in records
                         if t > start and t - lat < end]
                if spans:
                    out[model] = spans
        return out
