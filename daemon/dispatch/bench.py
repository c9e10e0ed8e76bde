"""Side-by-side timing of a plan, every single-target plan and the raw runtime on the file.

All variants are compiled first, warmed up, then timed interleaved: each round runs every
variant once, in an order shuffled per round (seeded), so a load spike on the shared board hits
every variant of that round alike. Each variant's turn is a burst: one untimed call that brings
its weights back into cache (without it a variant pays for whatever the variant before it
evicted), then enough timed calls to fill about ``BURST_MS`` (at least ``BURST`` calls); the
burst's median is the variant's time in that round. Rounds go on until every variant has
``budget_s`` of timed calls (at least ``runs`` rounds, at most ``MAX_ROUNDS``): a 0.05 ms model
timed 90 times is mostly timer and scheduler noise, timed 6000 times its median is steady.
Every variant is timed the same way, warm or cold, by the plan's own call time: under
``HEAVY_CALL_MS`` (the planning side by side's threshold) each burst starts with its untimed
call, above it every burst is one cold call. Decided per variant at 5 ms, a BiLSTM tagger's
variants straddling it were timed cold (4.8 ms warm, 6.6 cold: 37%) where the side by side
that chose among them had timed them warm; cold, its two-thread sessions led by 7%, warm its
one-thread ones by 6-10%, and the bench scored the choice against the other regime.
Medians are reported with the output error of each variant against the fp32 reference, plus the
median over rounds of each variant's time divided by the plan's time in the same round
(``paired_ratio``), which cancels most of the shared-board noise. The plan's ratio against the
best single target is held out from the pick and cross-fitted: picked on the odd rounds and
scored on the even ones, picked on the even rounds and scored on the odd ones, the two scores
averaged (:func:`held_out_best`).

Each variant is compiled ``compiles`` times and round ``r`` runs compile ``(r // 2) % compiles``
(odd and even rounds alike see every compile: with ``r % compiles`` the even rounds, which
score the plan against the best single, ran only the first compile of each, and a plan that
is one target's whole model lost 5% to that very target in two runs running): two
sessions of the very same bytes can sit a few percent apart for as long as they live (where
their buffers landed, which cores their pools woke on), and a plan that is one target's whole
model is exactly such a pair with that target. Rotating fresh compiles averages that offset out
of the ratio instead of reporting it as the plan's gain or loss: four by default, as six
sessions of one LSTM here sat up to 3% apart and two of each still let a plan that was one
target's whole model read 0.948x that very target. The compiles are made round-robin across
variants: sessions made one after another sit alike, and a variant whose compiles all came
from one stretch carried that stretch's offset. A variant over
``CRAWL_FACTOR`` times slower than the plan (Arm NN's reference kernels: seconds a run) gets
one compile and only ``CRAWL_ROUNDS`` rounds: its verdict is plain and its runs would be most
of the bench's time.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import numpy as np
import psutil

from edgepilot.backends.base import Target
from edgepilot.dispatch.execution.executor import CompiledPlan, CompiledSegment
from edgepilot.dispatch.measuring.contention import OtherLoad
from edgepilot.dispatch.measuring.tolerance import output_error
from edgepilot.dispatch.model_dispatch import ModelDispatch
from edgepilot.dispatch.planning.choice import compile_plan
from edgepilot.dispatch.planning.versus import HEAVY_CALL_MS
from edgepilot.dispatch.raw import Runner, raw_runner, raw_runtime
from edgepilot.errors import EdgepilotError

# fewest timed calls per burst, the wall time a burst aims at, the least run time (ms) a
# variant is taken for a crawler at, and the most rounds a bench runs
BURST = 3
BURST_MS = 2.0
CRAWL_FLOOR_MS = 5.0
MAX_ROUNDS = 400
# rotated compiles of each variant by default, and for a plan under LIGHT_MS (ms) a call: a
# light model's sessions sit furthest apart (a 0.1 ms VAD's four: 0.100-0.112 ms)
COMPILES = 4
LIGHT_COMPILES = 8
LIGHT_MS = 1.0
# calls, and ms of them, that estimate the plan's call time (compiles, warm or cold, crawlers)
ESTIMATE_CALLS, ESTIMATE_MS = 5, 100.0
# the most calls of each compile when the plan is timed alone (a 10 µs model: 0.08 s of calls)
MAX_SOLO_CALLS = 2000
# a variant this many times slower than the plan is timed in the first CRAWL_ROUNDS rounds only
CRAWL_FACTOR = 20.0
CRAWL_ROUNDS = 3


def plan_runner(md: ModelDispatch) -> Runner:
    """A fresh compile of the installed plan's segments (what :meth:`prepare` compiled)."""
    assert md.plan is not None and md.part is not None and md.builder is not None
    compiled = compile_plan(md.part, md.builder, md.backends, md.plan)
    return lambda f: compiled.run(f)[0]


def _compile_whole(md: ModelDispatch, target: str) -> Runner:
    """The whole model on ``target`` as edgepilot serves a one-target plan: through the
    plan's executor, as the plan runner is. The executor's per-call bookkeeping (two clock
    reads and the times the drift monitor needs: ~0.5 µs, 5% of a 10 µs wake-word model) is
    then on both sides of the plan-vs-single ratio, which judges the planner's choice; the
    ratio against the raw runtime still carries it."""
    assert md.part is not None
    parsed, n = Target.parse(target), len(md.part.layers)
    whole = md.part.segment(0, n)
    exe = md.backends[parsed.backend].compile(whole, parsed)
    plan = CompiledPlan([CompiledSegment(target, 0, n, whole, exe, 0.0)], md.part.outputs)
    return lambda f: plan.run(f)[0]


def bench(md: ModelDispatch, runs: int = 20, warmup: int = 3,
          budget_s: float = 0.3, compiles: int | None = None) -> dict[str, Any]:
    """The bench JSON (`edgepilot bench --json`) for a prepared (or preparable) model.

    ``runs`` is the fewest rounds, ``budget_s`` the timed seconds every variant gets at least,
    ``compiles`` how many fresh compiles of each variant the rounds rotate through (None:
    :data:`COMPILES`, or :data:`LIGHT_COMPILES` for a plan under :data:`LIGHT_MS` a call).
    """
    if md.compiled is None or md.plan is None:
        md.prepare()
    assert md.compiled is not None and md.plan is not None and md.part is not None
    feed = md.calibration[0]
    plan_compiled = md.compiled
    pool: dict[str, list[Runner]] = {"plan": [lambda f: plan_compiled.run(f)[0]]}
    whole = md.part.segment(0, len(md.part.layers))
    skipped: dict[str, str] = {}
    # a target whose whole model compiles to the very bytes of another's (int4 of a model with
    # no MatMul weights to pack is its fp32) is that target: timing both only gives noise a
    # second chance to name the best single
    twins: dict[str, str] = {} if md.builder is None else \
        md.builder.profile.extra.get("whole_twins", {})
    for target in md.targets:
        if twins.get(str(target)) in pool:
            skipped[str(target)] = f"the same compiled model as {twins[str(target)]}"
            continue
        backend = md.backends[target.backend]
        support = backend.supports(whole, target)
        if not support:
            skipped[str(target)] = support.reason
            continue
        try:
            pool[str(target)] = [_compile_whole(md, str(target))]
        except EdgepilotError as exc:
            skipped[str(target)] = exc.message
    try:
        pool["raw"] = [raw_runner(md)]
    except Exception as exc:  # the raw runtime is a reference, not a requirement
        skipped["raw"] = f"{type(exc).__name__}: {exc}"
    errors = {name: max(output_error(fns[0](f), ref, md.opts.metric)
                        for f, ref in zip(md.calibration, md.ref_outputs, strict=True))
              for name, fns in pool.items()}
    est = {name: _call_ms(fns[0], feed) for name, fns in pool.items()}
    # a variant far slower than the plan (a reference-kernel target: seconds a run) cannot
    # change the verdict: one compile, a few rounds, no more warm-ups. A first call can pay for
    # lazy set-up or a load spike: the plan and a variant that looks crawling are called again
    # and their fastest call decides (one wrongly taken for a crawler gets 3 rounds, 1 compile)
    est["plan"] = least_ms(pool["plan"][0], feed, est["plan"])
    crawling = max(CRAWL_FLOOR_MS, CRAWL_FACTOR * est["plan"])
    crawl = {name for name, ms in est.items() if name != "plan" and ms > crawling
             and least_ms(pool[name][0], feed, ms) > crawling}
    if compiles is None:
        compiles = LIGHT_COMPILES if est["plan"] < LIGHT_MS else COMPILES
    asked = compiles
    compiles = compiles_that_fit(md.path.stat().st_size, len(pool) - len(crawl), compiles,
                                 psutil.virtual_memory().available)
    # round-robin, one more of every variant at a time: sessions made one after another sit
    # alike (a plan's four compiles, made first, ran 0.605 ms where the same target's four,
    # made next, ran 0.615-0.652: the 0.95 of a plan against its own target); interleaved,
    # the two sets read 0.603 and 0.606
    for _ in range(max(1, compiles) - 1):
        for name, fns in pool.items():
            if name in crawl:
                continue
            fn = plan_runner(md) if name == "plan" else raw_runner(md) if name == "raw" \
                else _compile_whole(md, name)
            # a rotated compile that computed something else would time a different model
            errors[name] = max(errors[name], output_error(fn(md.calibration[0]),
                                                          md.ref_outputs[0], md.opts.metric))
            fns.append(fn)
    for name, fns in pool.items():
        if name in crawl:
            continue
        for _ in range(max(0, warmup - 1)):
            for fn in fns:
                t0 = time.perf_counter()
                fn(feed)
                est[name] = (time.perf_counter() - t0) * 1e3
    calls = {name: max(BURST, min(200, int(BURST_MS / max(ms, 1e-3)) + 1))
             for name, ms in est.items()}
    # cold (one call a burst, no untimed one): every variant when the plan's call is heavy,
    # as the side by side that chose the plan times it; a crawler always
    slow = set(pool) if est["plan"] >= HEAVY_CALL_MS else set(crawl)
    # each variant's burst median per round (a crawling variant sits out after CRAWL_ROUNDS)
    times: dict[str, dict[int, float]] = {name: {} for name in pool}
    # every timed call's ms, for the tail (p95) next to the medians
    calls_ms: dict[str, list[float]] = {name: [] for name in pool}
    # each burst's CPU ms per call, every thread of the process (intra-op workers included)
    cpu_ms: dict[str, list[float]] = {name: [] for name in pool}
    timed_s: dict[str, float] = dict.fromkeys(pool, 0.0)
    rng = random.Random(0)
    order = list(pool)
    rounds = 0
    meter = OtherLoad()
    while rounds < max(1, runs) or (min(v for n, v in timed_s.items() if n not in crawl)
                                    < budget_s and rounds < MAX_ROUNDS):
        rounds += 1
        rng.shuffle(order)
        for name in order:
            if name in crawl and rounds > CRAWL_ROUNDS:
                continue
            fns = pool[name]
            ms, spent = _burst(fns[(rounds // 2) % len(fns)], feed,
                               1 if name in slow else calls[name],
                               name in slow, calls_ms[name], cpu_ms[name])
            times[name][rounds] = ms
            timed_s[name] += spent
        if md.progress:  # the CLI's bar: rounds go on past ``runs`` until every budget is met
            md.progress(rounds, max(runs, rounds + 1),
                        f"bench round {rounds}: {len(pool)} variants side by side")
    if md.progress:
        md.progress(rounds, rounds, f"bench: {rounds} rounds")
    med = {name: statistics.median(ts.values()) for name, ts in times.items()}
    # the plan alone, as a request to a model serving by itself meets it: what the prediction
    # is of. In the rounds every burst follows other variants that evicted its weights and
    # woke other pools (a pose detector: 8.55 ms there, right after a check that read 8.5x
    # alone; a ResNet-50 11% over its own check)
    alone = solo_ms(pool["plan"], feed, budget_s)
    tol = md.opts.tolerance
    p95 = {name: round(percentile(ts, 95), 4) for name, ts in calls_ms.items()}
    cpu = {name: round(statistics.median(cs), 4) for name, cs in cpu_ms.items() if cs}
    single: dict[str, dict[str, Any]] = {
        name: {"median_ms": round(med[name], 4), "p95_ms": p95[name], "cpu_ms": cpu.get(name),
               "error": errors[name], "within_tolerance": errors[name] <= tol}
        for name in pool if name not in ("plan", "raw")}
    # one best single for every figure that names it: picked on rounds it is not scored on
    eligible = [n for n, v in single.items() if v["within_tolerance"]]
    picked = held_out_best(times, eligible) if eligible else None
    result: dict[str, Any] = {
        "model": md.name, "hash": md.plan.hash, "tolerance": tol, "runs": rounds,
        "compiles": {name: len(fns) for name, fns in pool.items()},
        **({"compiles_limited": f"{compiles} of the {asked} asked: the sessions would not fit "
                                "in half the memory available"} if compiles < asked else {}),
        "timed_s": {name: round(v, 3) for name, v in timed_s.items()},
        "plan": {"median_ms": round(med["plan"], 4), "p95_ms": p95["plan"],
                 "cpu_ms": cpu.get("plan"), "predicted_ms": round(md.plan.predicted_ms, 4),
                 "alone_ms": round(alone, 4),
                 "targets": [s[0] for s in md.plan.segments], "error": errors["plan"]},
        "single": single,
        "raw": {"median_ms": round(med["raw"], 4), "p95_ms": p95["raw"],
                "runtime": raw_runtime(md)}
        if "raw" in med else None,
        "speedup_vs_best_single": round(single[picked[0]]["median_ms"] / med["plan"], 3)
        if picked else None,
        # median over rounds of (single / plan) timed in the same round
        "paired_ratio": {name: round(statistics.median(
            ms / times["plan"][r] for r, ms in times[name].items()), 3)
            for name in pool if name != "plan"},
        "speedup_vs_best_single_paired": picked[1] if picked else None,
        "predicted_vs_measured": round(md.plan.predicted_ms / alone, 3),
        "predicted_vs_interleaved": round(md.plan.predicted_ms / med["plan"], 3),
        # a single-target plan's prediction is its whole model's profile timing: the CPU that
        # timing's runs took against the CPU the bench's took tells a change in the work from
        # a change in the parallelism the board's cores allowed (see timing.py)
        "cpu": _cpu_prediction(md, cpu.get("plan"), round(med["plan"], 4)),
        # the plan's own check right after compiling (warm, alone), predicted from earlier
        # measurements only (see calibration.py)
        "plan_time": {"predicted_ms": round(md.plan.predicted_ms, 4),
                      "measured_ms": md.plan.measured_ms and round(md.plan.measured_ms, 4),
                      "uncalibrated_ms": md.plan.uncalibrated_ms
                      and round(md.plan.uncalibrated_ms, 4),
                      "predicted_vs_measured": round(md.plan.predicted_ms / md.plan.measured_ms,
                                                     3) if md.plan.measured_ms else None,
                      "calibration": md.plan.calibration},
        "skipped": skipped,
        # other work's share of the CPUs while the rounds ran, and while the timings that
        # chose the plan ran (its whole models, its side by side): see contention.py
        "contention": {"bench": meter.share(), **_planning_contention(md)},
    }
    if picked is not None:
        result["best_single"] = picked[0]
    return result


def _planning_contention(md: ModelDispatch) -> dict[str, float]:
    assert md.plan is not None
    whole = None if md.builder is None else \
        md.builder.profile.extra.get("whole_contention")
    versus = (md.plan.versus_single or {}).get("contention")
    return {k: v for k, v in (("whole_models", whole), ("versus", versus)) if v is not None}


# a session holds about this many times its file's bytes (weights, prepacked copies, arena)
SESSION_BYTES_PER_FILE_BYTE = 4


def compiles_that_fit(file_bytes: int, variants: int, compiles: int, available: int) -> int:
    """How many rotated compiles of each variant to keep: ``compiles``, fewer (down to one)
    when every variant's sessions would take over half the memory available (a 65 MB VGG16's
    bench peaked at 2.7 GB with two of each, most of a 4 GB board)."""
    per_round = SESSION_BYTES_PER_FILE_BYTE * file_bytes * max(variants, 1)
    return max(1, min(compiles, int(available / 2 // max(per_round, 1))))


def solo_ms(fns: list[Runner], feed: dict[str, np.ndarray], budget_s: float) -> float:
    """The median ms of ``fns`` (compiles of one variant) timed alone, one after another:
    each gets an untimed call, then calls for ``budget_s / len(fns)`` (at least ``BURST``,
    at most ``MAX_SOLO_CALLS``)."""
    ts: list[float] = []
    for fn in fns:
        fn(feed)
        end = time.perf_counter() + budget_s / max(1, len(fns))
        for n in range(MAX_SOLO_CALLS):
            if n >= BURST and time.perf_counter() >= end:
                break
            ts.append(_call_ms(fn, feed))
    return statistics.median(ts)


def least_ms(fn: Runner, feed: dict[str, np.ndarray], first: float) -> float:
    """The least of ``first`` and up to ``ESTIMATE_CALLS`` more calls of ``fn`` (fewer once
    they took ``ESTIMATE_MS``): a 0.6 ms segmenter's first two calls read over 1 ms in three
    runs of eight, and its 4 compiles, not 8, read 0.97 of its own target (8: 1.00)."""
    best, spent = first, 0.0
    for _ in range(ESTIMATE_CALLS):
        ms = _call_ms(fn, feed)
        best, spent = min(best, ms), spent + ms
        if spent >= ESTIMATE_MS:
            break
    return best


def _call_ms(fn: Runner, feed: dict[str, np.ndarray]) -> float:
    t0 = time.perf_counter()
    fn(feed)
    return (time.perf_counter() - t0) * 1e3


def held_out_best(times: dict[str, dict[int, float]], names: list[str]) -> tuple[str, float]:
    """The best single target (picked on the odd rounds) and the plan's paired ratio against
    it, cross-fitted: the odd rounds' pick scored on the even rounds, the even rounds' pick on
    the odd ones (each the median of its time over the plan's, round by round), averaged.
    Picked and scored on the same rounds, the lowest of near-equal variants is low by its own
    noise (the winner's curse); scored on one half only, a plan that was its best single's
    very target read 0.969 (1.002 on all rounds, 37 a half). Under two rounds each: all."""
    def med(name: str, parity: int | None) -> float:
        ts = [ms for r, ms in times[name].items() if parity is None or r % 2 == parity]
        return statistics.median(ts) if ts else float("inf")

    def scored(name: str, parity: int | None) -> float:
        return statistics.median(ms / times["plan"][r] for r, ms in times[name].items()
                                 if r in times["plan"] and (parity is None or r % 2 == parity))
    if not all(len(times[n]) >= 2 for n in names):
        best = min(names, key=lambda n: med(n, None))
        return best, round(scored(best, None), 3)
    picks = [min(names, key=lambda n: med(n, 1 - p)) for p in (0, 1)]
    return picks[0], round(statistics.mean(scored(picks[p], p) for p in (0, 1)), 3)


def _cpu_prediction(md: ModelDispatch, cpu_ms: float | None, wall_ms: float
                    ) -> dict[str, Any] | None:
    """The plan's CPU ms a run, profiled and benched, and the parallelism (CPU / wall) of
    each; None unless the plan is one target's whole model with a profiled CPU figure."""
    assert md.plan is not None and md.builder is not None
    if len(md.plan.segments) != 1 or cpu_ms is None:
        return None
    target = md.plan.segments[0][0]
    extra = md.builder.profile.extra
    profiled, whole = extra.get("whole_cpu_ms", {}).get(target), extra.get("whole_ms", {})
    if profiled is None or not whole.get(target):
        return None
    return {"profiled_ms": round(profiled, 4), "measured_ms": cpu_ms,
            "profiled_vs_measured": round(profiled / cpu_ms, 3) if cpu_ms else None,
            "parallelism_profiled": round(profiled / whole[target], 2),
            "parallelism_measured": round(cpu_ms / wall_ms, 2) if wall_ms else None}


def _burst(fn: Runner, feed: dict[str, np.ndarray], calls: int,
           slow: bool, into: list[float] | None = None,
           cpu_into: list[float] | None = None) -> tuple[float, float]:
    """One variant's turn: an untimed call (unless slow), then ``calls`` timed ones.

    Returns the median ms of the timed calls and the seconds they took together; each timed
    call's ms is appended to ``into`` as well, and the burst's CPU ms per call (every thread
    of the process) to ``cpu_into``.
    """
    if not slow:
        fn(feed)
    ts = []
    c0 = time.process_time()
    for _ in range(max(1, calls)):
        t0 = time.perf_counter()
        fn(feed)
        ts.append((time.perf_counter() - t0) * 1e3)
    if cpu_into is not None:
        cpu_into.append((time.process_time() - c0) * 1e3 / max(1, calls))
    if into is not None:
        into.extend(ts)
    return statistics.median(ts), sum(ts) / 1e3


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (linear between closest ranks; 0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
