"""How a compiled plan is timed: one procedure for every figure a prediction is compared with.

A single-target plan is predicted by the profile's timing of that target's whole model, and
checked by timing the compiled plan; ``bench`` then times the same plan again. Those figures
are compared as predicted/measured, so they are taken one way: the model run through the
plan's own executor (:class:`CompiledPlan`, whose per-call wrapper is part of what a request
pays: 8% of a 10 µs streaming model), on the feed the plan is checked on, warmed up, over at
least :data:`SETTLE_MS` of timed runs, and reported as the median of those runs. The profile
once took the lower of two short medians (7 runs each) of the bare executable instead: on a
board where other work comes and goes, the lower of two short windows is a quiet spell, and
predictions sat 20-50% under what the same session measured a minute later.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edgepilot.dispatch.execution.executor import CompiledPlan

# short layers get more timed runs: at least this much timed wall time, at most MAX_RUNS runs
MIN_TIMED_MS = 3.0
MAX_RUNS = 300
# a plan (or a whole model the profile predicts one by) is timed for at least this long: the
# fastest run a plan publishes is what a board of the same kind verifies against, and on a
# busy machine a few runs may all be slowed
SETTLE_MS = 300.0
# and no longer than this once EARLY_RUNS runs are in: a 200 ms model's seventh run tells
# nothing its fifth did not, and planning a heavy detector took minutes of such runs
MAX_TIMED_MS = 1000.0
LAYER_MAX_TIMED_MS = 500.0   # the same cap for one (layer, target) cell, whose pass is repeated
EARLY_RUNS = 3


def time_plan(compiled: CompiledPlan, feed: dict[str, Any], runs: int, warmup: int = 1,
              min_total_ms: float = MIN_TIMED_MS, max_runs: int = MAX_RUNS,
              fastest: list[float] | None = None, cpu: list[float] | None = None
              ) -> tuple[float, list[float]]:
    """Median end-to-end ms of ``compiled`` and the median ms of each of its segments.

    Short plans get more runs (at least ``min_total_ms`` of timed wall time), like the profiler
    gives short layers. ``fastest``, when given, is filled with the fastest run: end to end,
    then per segment. ``cpu``, when given, is filled with the median CPU ms of a run, every
    thread of the process counted (a runtime's intra-op workers too): CPU over wall is the
    parallelism a run got, which moves with what else the board's cores are doing while the
    work itself stays put.
    """
    for _ in range(max(0, warmup)):
        compiled.run(feed)
    totals: list[float] = []
    cpus: list[float] = []
    per: list[list[float]] = [[] for _ in compiled.segments]
    want = max(1, runs)
    while len(totals) < want:
        c0, t0 = time.process_time(), time.perf_counter()
        _, times = compiled.run(feed)
        totals.append((time.perf_counter() - t0) * 1e3)
        cpus.append((time.process_time() - c0) * 1e3)
        for k, ms in enumerate(times):
            per[k].append(ms)
        if len(totals) == want and sum(totals) < min_total_ms:
            avg = sum(totals) / len(totals)
            want = min(max_runs, max(want, int(min_total_ms / max(avg, 1e-6)) + 1))
        elif len(totals) >= EARLY_RUNS and sum(totals) >= MAX_TIMED_MS:
            break
    if fastest is not None:
        fastest[:] = [min(totals), *(min(p) if p else 0.0 for p in per)]
    if cpu is not None:
        cpu[:] = [statistics.median(cpus)]
    return statistics.median(totals), [statistics.median(p) if p else 0.0 for p in per]


def plan_timing(compiled: CompiledPlan, feed: dict[str, Any], runs: int, settle: bool = False,
                cpu: list[float] | None = None) -> tuple[float, list[float], list[float]]:
    """:func:`time_plan` of a plan just checked (its output check ran it, so no warm-up) with
    its fastest run, end to end then per segment; ``settle``: a plan made here (or a whole
    model a plan will be predicted by), timed after a warm-up run for :data:`SETTLE_MS` at
    least; ``cpu``: see :func:`time_plan`."""
    fastest: list[float] = []
    return (*time_plan(compiled, feed, runs, int(settle), SETTLE_MS if settle else MIN_TIMED_MS,
                       MAX_RUNS, fastest, cpu), fastest)


def burst_ms(fn: Callable[[], object], calls: int, warm: bool = True) -> float:
    """One variant's turn in an interleaved comparison: an untimed call (``warm``: the others
    ran in between, it brings this one's weights back into cache), then the median ms of
    ``calls``."""
    if warm:
        fn()
    ts = []
    for _ in range(max(1, calls)):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def median_ms(fn: Callable[[], object], runs: int, warmup: int,
              min_total_ms: float = 0.0, bound_ms: float | None = None) -> float:
    """Median wall time of ``fn`` in ms after ``warmup`` untimed calls.

    ``min_total_ms`` adds runs (up to MAX_RUNS) until that much time was timed: a 20 µs layer
    timed 7 times is mostly timer and scheduler noise, timed 150 times its median is stable.
    ``bound_ms``: stop after EARLY_RUNS runs (and ``min_total_ms``) whose median is over it (a
    loser stays a loser).
    """
    for _ in range(warmup):
        fn()
    times: list[float] = []
    want = max(1, runs)
    while len(times) < want:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if (bound_ms is not None and len(times) >= EARLY_RUNS
                and sum(times) * 1e3 >= min_total_ms
                and statistics.median(times) * 1e3 > bound_ms):
            break  # (a short layer gets its min_total_ms first: 3 runs of 20 µs are noise)
        if len(times) >= EARLY_RUNS and sum(times) * 1e3 >= LAYER_MAX_TIMED_MS:
            break  # a heavy layer: its median is steady long before ``runs``
        if len(times) == want and min_total_ms > 0:
            total_ms = sum(times) * 1e3
            if total_ms < min_total_ms:
                per = total_ms / len(times)
                want = min(MAX_RUNS, max(want, int(min_total_ms / max(per, 1e-6)) + 1))
    return statistics.median(times) * 1e3


def copy_bandwidth(nbytes: int = 4 << 20, runs: int = 7) -> float:
    """Host-memory bytes per ms for handing a tensor over (one copy, the worst case here)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    ms = median_ms(lambda: np.copyto(dst, src), runs, 1)
    return nbytes / max(ms, 1e-6)
