"""Timing a new plan's segments alone, before its prediction is trusted.

A layer sum misses what a compiled segment does across its layers (fusion, cache reuse, one
call instead of several); the profile times each target's whole model for that, and a split
plan's segments are timed here, alone, like the profile's cells (``passes`` medians, the
lowest kept). The plan's prediction then rests on these earlier timings of its own segments;
its end-to-end check is measured afterwards.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from edgepilot.dispatch.execution.executor import CompiledPlan
from edgepilot.dispatch.graph.partition import Partition
from edgepilot.dispatch.measuring.timing import MIN_TIMED_MS, median_ms
from edgepilot.dispatch.planning.plan import CostBuilder, Plan


def time_new_segments(b: CostBuilder, part: Partition, plan: Plan, compiled: CompiledPlan,
                      feed: dict[str, np.ndarray], runs: int, warmup: int, passes: int) -> None:
    """Time alone every segment of ``plan`` never timed as one graph, then re-predict it."""
    new = [k for k, seg in enumerate(compiled.segments)
           if not b.calibration.has(seg.target, seg.start, seg.end)]
    if not new:
        return
    env: dict[str, np.ndarray] = dict(feed)
    feeds = []
    for seg in compiled.segments:
        feeds.append({name: env[name] for name in seg.segment.inputs})
        env.update(seg.exe.run(feeds[-1]))
    best: dict[int, float] = {}
    for _ in range(max(1, passes)):
        for k in new:
            ms = median_ms(partial(compiled.segments[k].exe.run, feeds[k]), runs, warmup,
                           MIN_TIMED_MS)
            best[k] = min(ms, best.get(k, ms))
    segs = compiled.segments
    b.record([(segs[k].target, segs[k].start, segs[k].end) for k in new],
             [best[k] for k in new], source="segment")
    table = b.table()
    predicted = b.plan_ms(table, [table.targets.index(t) for t in plan.targets])
    if predicted < float("inf"):  # inf: a whole-model plan of layers that fail alone
        plan.predicted_ms = predicted
    plan.calibration = b.calibration.summary(plan.segments, len(part.layers))
    for seg, ms in zip(segs, b.segment_predictions(table, plan.segments), strict=True):
        seg.predicted_ms = ms
