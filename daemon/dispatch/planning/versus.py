"""A plan never loses: a split plan is timed against the best single whole-model target before
it is served, and a one-target plan against a close rival target (:func:`rival`).

Predictions rest on layer timings and measured hop costs, and on a sub-millisecond model the
bookkeeping between segments can outweigh what a split gains. So a plan of several segments is
timed end to end next to the whole model on the fastest single target whose whole-model output
is within tolerance, interleaved in the same window (each round runs both, in alternating
order, a burst of calls each, as ``bench`` does), and kept only when the median over rounds of
``single / plan`` exceeds ``1 + margin`` and the rounds' spread. Otherwise the single target is
the plan, and its ``reason`` says what was measured.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from edgepilot.backends.base import Backend, Target
from edgepilot.dispatch.execution.executor import CompiledPlan, CompiledSegment
from edgepilot.dispatch.graph.partition import Partition
from edgepilot.dispatch.measuring.contention import CONTENDED, OtherLoad
from edgepilot.dispatch.measuring.measure import Progress
from edgepilot.dispatch.measuring.timing import burst_ms
from edgepilot.dispatch.planning.choice import describe
from edgepilot.dispatch.planning.plan import CostBuilder, Plan, segments_of
from edgepilot.errors import EdgepilotError

Runner = Callable[[dict[str, np.ndarray]], object]
ROUNDS = 9
# timed wall time a burst aims at (at least one call): a 3 ms burst held one call of a 4 ms
# model, right after the other variant ran, where a two-thread session's pool had gone idle:
# it read 3.96 ms side by side and 2.87 ms in the bench's longer bursts, and the one-thread
# rival it had beaten by 30% stood
BURST_MS = 20.0
MAX_CALLS = 50
# a heavy model stops after MIN_ROUNDS once this much wall time went by: nine rounds of a
# 300 ms detector (each burst with its untimed call) held planning for 11 s
BUDGET_MS = 3000.0
MIN_ROUNDS = 5
# a call this long needs no untimed call before its burst: the cache its weights would find
# warm is a rounding error next to it
HEAVY_CALL_MS = 20.0
# a whole-model target whose profile timing came within this factor of the chosen one's is
# timed against it side by side before the plan serves (see :func:`rival`)
RIVAL_WITHIN = 1.25
# a one-target plan whose whole model runs under this (ms) is timed side by side against every
# other whole-model target, not only a close one (see :func:`rivals`)
LIGHT_MS = 2.0
# a side by side over which other work took more than CONTENDED of the CPUs is timed again, up
# to this many tries in all, and the least contended one decides
CONTENDED_TRIES = 3
# ... but only a side by side this short (s) is made again: a heavy model's took 5 s a try, and
# three of them held a 1.1 MB audio model's planning past a minute
RETRY_MAX_S = 1.5
# whole models timed while other work ran: every target within this factor of the chosen one's
# is a rival (a two-thread session read 1.45x the one-thread one under a build, 0.69x quiet)
CONTENDED_WITHIN = 2.0
# a rival whole model replaces the one chosen when it ran faster side by side (the rounds'
# median) by more than this: the choice came from timings one after another, noisier. With 2%
# and the rounds' noise to beat, ppocr-rec's two-thread rival, 2-5% faster side by side, lost
# in four runs of five (the bench: 0.948-0.968 of it)
SWAP_MARGIN = 0.005
# a kept verdict that came within CLOSE of a tie is timed again once it is older than
# VERDICT_FRESH_S (s): two thread counts of one runtime 3% apart when planned read 26% apart
# fifteen minutes later on a quiet 2-vCPU board, and the plan loaded from the cache served the
# slower one; a restart within the minute (a crash loop, a test) still serves what was decided
CLOSE = 0.15
VERDICT_FRESH_S = 120.0
# at equal speed the target taking less CPU serves: a rival whose whole model took at most
# CHEAPER of the chosen one's CPU time a run (one thread against two) replaces it when side by
# side it was at most TIE slower. A one-thread BiLSTM tagger tied a two-thread session (x1.000)
# when planned and then ran 5% faster in the bench, and at the same latency it leaves a core
# to the board's other work and draws less power. Not one slower by any measured amount: the
# one-thread MTCNN O-Net replaced a two-thread session at x1.009 (TIE was 0.01) and then ran
# 5.5% slower than it in the bench; a side by side is not that exact
CHEAPER = 0.8
TIE = 0.0


@dataclass
class Verdict:
    """What the side-by-side timing found."""

    plan_ms: float
    single_ms: float
    ratio: float          # median over rounds of single / plan (> 1: the plan is faster)
    noise: float          # half the spread (interquartile) of the per-round ratios
    keep_plan: bool
    contention: float = 0.0   # other work's share of the CPUs meanwhile (contention.py)
    tries: int = 1            # side by sides made (contended ones are made again)


def versus(plan: Runner, single: Runner, feed: dict[str, np.ndarray], margin: float,
           rounds: int = ROUNDS, progress: Progress | None = None,
           tries: int = CONTENDED_TRIES, deadline: float | None = None) -> Verdict:
    """Time ``plan`` and ``single`` side by side; keep the plan only when it wins beyond
    ``margin`` and the noise of the rounds. A side by side over which other work took more
    than :data:`CONTENDED` of the CPUs is made again (up to :data:`CONTENDED_TRIES` in all,
    when it took under :data:`RETRY_MAX_S`) and the least contended one decides: a spell of
    load favours the one-thread target. ``deadline`` (``time.monotonic()``): no try is begun
    that would end past it."""
    made: list[Verdict] = []
    while len(made) < max(1, tries):
        t0 = time.monotonic()
        v = _side_by_side(plan, single, feed, margin, rounds, progress)
        made.append(v)
        now = time.monotonic()
        if v.contention <= CONTENDED or now - t0 > RETRY_MAX_S or (
                deadline is not None and now + (now - t0) > deadline):
            break
    best = min(made, key=lambda v: v.contention)
    best.tries = len(made)
    return best


def _side_by_side(plan: Runner, single: Runner, feed: dict[str, np.ndarray], margin: float,
                  rounds: int, progress: Progress | None) -> Verdict:
    meter = OtherLoad()
    t0 = time.perf_counter()
    one = burst_ms(partial(plan, feed), 1, warm=False)
    if one < HEAVY_CALL_MS:  # the faster of two sizes the bursts: one stall cuts them all
        one = max(min(one, burst_ms(partial(plan, feed), 1, warm=False)), 1e-3)
    calls = max(1, min(MAX_CALLS, int(BURST_MS / one)))
    warm = one < HEAVY_CALL_MS
    p_times: list[float] = []
    s_times: list[float] = []
    for r in range(rounds):
        if r >= MIN_ROUNDS and (time.perf_counter() - t0) * 1e3 > BUDGET_MS:
            break
        if progress:  # also where a stopping daemon cancels planning
            progress(r + 1, rounds, "the plan against the best single target, side by side")
        order = [(plan, p_times), (single, s_times)]
        for fn, into in (order if r % 2 == 0 else order[::-1]):
            into.append(burst_ms(partial(fn, feed), calls, warm))
    ratios = sorted(s / p for s, p in zip(s_times, p_times, strict=True))
    ratio = statistics.median(ratios)
    q = max(1, len(ratios) // 4)
    noise = (ratios[-q - 1] - ratios[q]) / 2 if len(ratios) > 2 * q else 0.0
    keep = ratio > 1.0 + max(margin, noise)
    return Verdict(statistics.median(p_times), statistics.median(s_times), ratio, noise, keep,
                   meter.share())


def rival(builder: CostBuilder, plan: Plan) -> str | None:
    """For a one-target plan: the fastest other whole-model target within tolerance whose
    profile timing came within :data:`RIVAL_WITHIN` of the chosen one's (None: no such).

    Whole models are timed one after another while planning; two close ones (one thread or
    two, fp32 or int8 of a small encoder) can swap places in a window where load came and went
    (MiniLM's chosen ``cpu-1t/int8`` then ran 0.78x the ``cpu/fp32`` it had beaten). Side by
    side, interleaved, the rival replaces the choice only by winning beyond the noise."""
    own = plan.segments[0][0]
    whole = builder.profile.extra.get("whole_ms", {})
    errors = builder.profile.extra.get("whole_error", {})
    twins = builder.profile.extra.get("whole_twins", {})
    mine = whole.get(own)
    if mine is None:
        return None
    same = {own, twins.get(own)} | {t for t, of in twins.items() if of == own}
    close = [t for t in builder.profile.targets if t not in same and t in whole
             and t not in builder.excluded and errors.get(t, 0.0) <= builder.tolerance
             and whole[t] <= RIVAL_WITHIN * mine]
    return min(close, key=lambda t: whole[t]) if close else None


def rivals(builder: CostBuilder, plan: Plan) -> list[str]:
    """The whole-model targets a plan is timed against side by side, in order: the best
    single target for a split (then, when it is light, every other light one); for a
    one-target plan its :func:`rival`, or, when the choice
    runs under :data:`LIGHT_MS`, every other whole-model target within tolerance whose
    profile timing is light too, fastest first. A light model's profile timings are a few
    microseconds apart and one spell of load swaps them (a 10 µs tree ensemble read 0.155 ms
    on the target that ran it in 8 µs), while timing all of them side by side costs well
    under a second. Whole models timed while other work took the CPUs (``whole_contention``
    over :data:`CONTENDED`) widen that to every target within :data:`CONTENDED_WITHIN`."""
    whole = builder.profile.extra.get("whole_ms", {})
    contended = builder.profile.extra.get("whole_contention", 0.0) > CONTENDED
    within = CONTENDED_WITHIN if contended else RIVAL_WITHIN
    if len(plan.segments) > 1:
        # a light model's best single by profile is a coin toss among the light ones (a
        # 3-segment LSTM plan was held against int4 at 0.098 ms, not fp32 at 0.059): all go
        best = builder.best_whole()
        if best is None:
            return []
        return [best, *_others(builder, best, whole[best], within)] \
            if whole[best] <= LIGHT_MS or contended else [best]
    own = plan.segments[0][0]
    mine = whole.get(own)
    if mine is not None and contended:
        return _others(builder, own, mine, within)
    if mine is None or mine > LIGHT_MS:
        close = rival(builder, plan)
        return [close] if close is not None else []
    return _others(builder, own, mine, within)


def _others(builder: CostBuilder, own: str, mine: float, within: float) -> list[str]:
    """Every whole-model target but ``own`` (and its twins) within tolerance whose profile
    timing is light too (or within ``within`` times ``mine``), fastest first."""
    whole = builder.profile.extra.get("whole_ms", {})
    errors = builder.profile.extra.get("whole_error", {})
    twins = builder.profile.extra.get("whole_twins", {})
    same = {own, twins.get(own)} | {t for t, of in twins.items() if of == own}
    # those light too: a reference kernel at 500 ms a call (Arm NN's CpuRef) is no timing
    # accident, and five rounds of it held a 1 ms model's planning for a minute
    others = [t for t in builder.profile.targets if t not in same and t in whole
              and t not in builder.excluded and errors.get(t, 0.0) <= builder.tolerance
              and twins.get(t) in (None, t) and whole[t] <= max(LIGHT_MS, within * mine)]
    return sorted(others, key=lambda t: whole[t])


def single_instead(name: str, builder: CostBuilder, part: Partition, plan: Plan,
                   compiled: CompiledPlan, backends: Mapping[str, Backend],
                   feed: dict[str, np.ndarray], margin: float,
                   check: Callable[[CompiledPlan], float],
                   progress: Progress | None = None,
                   deadline: float | None = None) -> tuple[Plan, CompiledPlan] | None:
    """The best single target's plan when ``plan`` does not beat it side by side (None: keep
    ``plan``; its ``versus_single`` records the timing either way). Each of :func:`rivals`
    is timed against what won so far (then :func:`then_rivals`). ``deadline``
    (``time.monotonic()``): the planning budget's end; a side by side that would run past it
    is not made (a model planned whole for the budget, whose rounds take seconds each)."""
    if margin < 0:
        return None  # a negative margin keeps any split (tests pinning one)
    best: tuple[Plan, CompiledPlan] | None = None
    whole = builder.profile.extra.get("whole_ms", {})
    targets = rivals(builder, plan)
    queued = set(targets)  # every target met or to be met: none is timed twice
    while targets:
        target = targets.pop(0)
        current, running = best or (plan, compiled)
        need_s = (1 + 2 * MIN_ROUNDS) * max(whole.get(target, 0.0), current.predicted_ms) / 1e3
        if deadline is not None and time.monotonic() + need_s > deadline:
            current.versus_single = {"target": target, "kept": "plan", "skipped":
                                     f"~{need_s:.0f} s side by side, past [dispatch] "
                                     "planning_budget_s"}
            continue
        won = _challenge(name, builder, part, current, running, target, backends, feed,
                         margin, check, progress, deadline)
        if won is not None:
            if best is not None:
                best[1].close()  # an earlier winner, beaten in turn
            best = won
            more = then_rivals(builder, plan, won[0], queued)
            targets += more
            queued.update(more)
    return best


def then_rivals(builder: CostBuilder, plan: Plan, won: Plan, seen: set[str]) -> list[str]:
    """The targets a single target that beat ``plan`` meets next (none in ``seen``): when
    ``plan`` was a split, the winner's own :func:`rivals`, as a one-target plan meets them. A
    split is timed against the single target its profile timing named, and ppocr-rec's lost to
    one thread, which the bench then timed 12% slower than two: a pair never side by side."""
    if len(plan.segments) == 1 or len(won.segments) != 1:
        return []
    return [t for t in rivals(builder, won) if t not in seen]


def _challenge(name: str, builder: CostBuilder, part: Partition, plan: Plan,
               compiled: CompiledPlan, target: str, backends: Mapping[str, Backend],
               feed: dict[str, np.ndarray], margin: float,
               check: Callable[[CompiledPlan], float],
               progress: Progress | None, deadline: float | None = None
               ) -> tuple[Plan, CompiledPlan] | None:
    """``target`` whole against ``plan`` side by side: its plan when it wins (see
    :func:`single_instead`)."""
    n = len(part.layers)
    # the verdict on this very pairing is kept with the profile: a restart, a plan from the
    # cache or one adopted from a board of the same kind serves what was decided, not what
    # one more noisy timing would say (nor compiles the single target to keep the split)
    segments = [list(seg) for seg in plan.segments]
    verdicts = builder.profile.extra.setdefault("versus_all", [])
    prior = prior_verdict(verdicts, segments, target)
    v = None
    if prior is not None:
        v = Verdict(prior["plan_ms"], prior["single_ms"], prior["ratio"], prior["noise"],
                    prior["kept"] == "plan", prior.get("contention", 0.0),
                    prior.get("tries", 1))
        if v.keep_plan:
            plan.versus_single = {k: prior[k] for k in prior if k != "segments"}
            return None
    whole_ms = float(builder.profile.extra.get("whole_ms", {}).get(target, plan.predicted_ms))
    single = _whole(target, part, backends, whole_ms)
    if single is None:
        return None
    if v is None:
        # a one-target plan's own session can be the profile's fastest, kept open
        # (``take_spare``): picked for its luck among sessions as much as for its target, it
        # met fresh rivals ahead and lost to them in the bench's fresh compiles
        mine = _whole(str(plan.segments[0][0]), part, backends, plan.predicted_ms) \
            if len(plan.segments) == 1 else None
        runner = mine if mine is not None else compiled
        try:
            v = versus(lambda f: runner.run(f), lambda f: single.run(f), feed, margin,
                       progress=progress, deadline=deadline)
        finally:
            if mine is not None:
                mine.close()
        if len(plan.segments) == 1:  # a rival replaces a whole model only by winning
            v.keep_plan = not rival_wins(v.ratio, v.noise, margin,
                                         cheaper(builder, target, plan.segments[0][0]))
    record = {"target": target, "plan_ms": round(v.plan_ms, 4),
              "single_ms": round(v.single_ms, 4), "ratio": round(v.ratio, 3),
              "noise": round(v.noise, 3), "kept": "plan" if v.keep_plan else "single",
              "contention": round(v.contention, 3), **({"tries": v.tries} if v.tries > 1 else {})}
    plan.versus_single = record
    builder.profile.extra["versus"] = {**record, "segments": segments}
    if prior is None:
        keep_verdict(verdicts, {**record, "segments": segments, "at": round(time.time())})
    if v.keep_plan:
        single.close()
        return None
    table = builder.table()
    # from the rounded record, as a verdict restored from the profile is: the same text
    what = f"the {len(plan.segments)}-segment plan" if len(plan.segments) > 1 \
        else f"{plan.segments[0][0]} whole"
    # predicted by what was just measured side by side, not the profile's timing it overturned
    out = describe(name, builder, [table.targets.index(target)] * n, v.single_ms, table,
                   f"single target {target}: {what} measured "
                   f"{record['plan_ms']:.3f} ms against {record['single_ms']:.3f} ms whole, "
                   f"side by side (x{record['ratio']:.3f}, noise {record['noise']:.3f}): "
                   + ("not faster beyond the noise" if len(plan.segments) > 1
                      or rival_wins(v.ratio, v.noise, margin)  # faster, not only cheaper
                      else f"a tie, and {target} takes less CPU a run"))
    out.error, out.measured_ms, out.versus_single = check(single), v.single_ms, record
    return out, single


def _whole(target: str, part: Partition, backends: Mapping[str, Backend],
           ms: float) -> CompiledPlan | None:
    """A fresh compile of ``target``'s whole model as a plan (None: it did not compile)."""
    t, whole = Target.parse(target), part.segment(0, len(part.layers))
    try:
        exe = backends[t.backend].compile(whole, t)
    except (EdgepilotError, KeyError):
        return None
    return CompiledPlan([CompiledSegment(target, 0, len(part.layers), whole, exe, ms)],
                        part.outputs)


def rival_wins(ratio: float, noise: float, margin: float, is_cheaper: bool = False) -> bool:
    """Whether a whole-model rival replaces a one-target plan: ``ratio`` (rival / plan,
    median over rounds) under 1 by more than the smaller of ``margin`` and
    :data:`SWAP_MARGIN`; or, for a rival that ``is_cheaper`` (:func:`cheaper`), a tie: at
    most :data:`TIE` slower. ``noise`` (the rounds' spread) is recorded with the verdict, not
    a shield for the choice (see :data:`SWAP_MARGIN`)."""
    del noise
    if is_cheaper and ratio <= 1.0 + TIE:
        return True
    return ratio < 1.0 - min(margin, SWAP_MARGIN)


def cheaper(builder: CostBuilder, rival_target: str, own: str) -> bool:
    """Whether ``rival_target``'s whole model took at most :data:`CHEAPER` of the CPU time
    ``own``'s did, a run, as profiled (one intra-op thread against two, on the same kernels)."""
    cpu = builder.profile.extra.get("whole_cpu_ms", {})
    mine, theirs = cpu.get(own), cpu.get(rival_target)
    return bool(mine and theirs is not None and theirs <= CHEAPER * mine)


def prior_verdict(verdicts: list[dict[str, Any]], segments: list[list[Any]], target: str,
                  now: float | None = None) -> dict[str, Any] | None:
    """The verdict kept on this pairing (plan ``segments`` against ``target`` whole), unless
    other work took over :data:`CONTENDED` of the CPUs while it was timed, or it was a near
    tie (within :data:`CLOSE`) timed over :data:`VERDICT_FRESH_S` ago (``now``:
    ``time.time()``): those are timed again rather than served for as long as the profile
    lives. A clear verdict stands; a close one says only which was faster then."""
    now = time.time() if now is None else now
    return next((r for r in verdicts if r.get("segments") == segments
                 and r.get("target") == target
                 and r.get("contention", 0.0) <= CONTENDED
                 and not (abs(float(r.get("ratio", 0.0)) - 1.0) <= CLOSE
                          and now - float(r.get("at", 0.0)) > VERDICT_FRESH_S)), None)


def keep_verdict(verdicts: list[dict[str, Any]], record: dict[str, Any]) -> None:
    """Keep ``record`` (with its ``segments``) as the verdict on its pairing, in place of a
    contended one timed before it."""
    verdicts[:] = [r for r in verdicts if r.get("segments") != record["segments"]
                   or r.get("target") != record["target"]]
    verdicts.append(record)


def lost_before(builder: CostBuilder, targets: list[str], current: list[str]) -> bool:
    """Whether the plan putting layer ``i`` on ``targets[i]`` has lost side by side to the
    single target that ``current`` (the plan served) runs every layer on. A replan that
    chooses it would compile it only for its recorded verdict to hand back the plan served
    (:func:`_challenge`), in the request's path."""
    if len(set(current)) != 1 or targets == current:
        return False
    segments = [[seg["target"], *seg["layers"]] for seg in segments_of(targets)]
    prior = prior_verdict(builder.profile.extra.get("versus_all", []), segments, current[0])
    return prior is not None and prior.get("kept") == "single"
