"""What a hop between two segments costs, measured by its kind at the cut a plan makes.

The profile charges a cut the copy of its boundary tensors through host memory (bytes over the
bandwidth :func:`copy_bandwidth` measured). What a hop really costs depends on its kind, the
runtime and device on each side: onnxruntime reads a numpy array in place, a TFLite interpreter
copies it into its arena, a GPU runtime moves it over the bus, and the runtime left behind may
still hold the cache or the cores the next one needs. So the first time the planner wants a cut
of a kind not measured on this board, that cut is measured: its two layers, each compiled on
its side's target, timed alone and as a two-segment plan (the executor a request goes
through), interleaved in rounds; what the pair takes beyond the two alone is the hop. A kind's
fixed cost is that less the bytes' copy time, and any cut of that kind is charged
``max(0, fixed + bytes / bandwidth)``: the copy scales with the tensor, the rest comes with the
kind. A pair of targets of the same runtime and device (two variants) is a kind too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from edgepilot.backends.base import Backend, Target
from edgepilot.dispatch.execution.executor import CompiledPlan, CompiledSegment
from edgepilot.dispatch.graph.partition import Partition
from edgepilot.dispatch.measuring.timing import burst_ms
from edgepilot.errors import EdgepilotError

ROUNDS = 9
BURST_MS = 2.0   # timed wall time one burst aims at
MAX_CALLS = 100


def hop_kind(src: str, dst: str) -> str:
    """``backend/device->backend/device`` of a hop from target ``src`` to target ``dst``."""
    a, b = Target.parse(src), Target.parse(dst)
    return f"{a.backend}/{a.device}->{b.backend}/{b.device}"


def measure_hop(part: Partition, backends: Mapping[str, Backend], src: Target, dst: Target,
                cut: int, env: Mapping[str, np.ndarray], rounds: int = ROUNDS) -> float | None:
    """Milliseconds a hop from ``src`` to ``dst`` before layer ``cut`` adds to the two layers
    around it run alone (median over interleaved rounds; may be negative within the noise).
    ``env``: every tensor of a reference run. None when either layer does not compile here."""
    a_seg, b_seg = part.segment(cut - 1, cut), part.segment(cut, cut + 1)
    exes = []
    try:
        for seg, target in ((a_seg, src), (b_seg, dst)):
            exes.append(backends[target.backend].compile(seg, target))
    except (EdgepilotError, KeyError):
        for exe in exes:
            exe.close()
        return None
    a_exe, b_exe = exes
    a_feed = {k: env[k] for k in a_seg.inputs}
    b_feed = {k: env[k] for k in b_seg.inputs}
    # the pair gets what a plan's segment pair would: the first layer's inputs and whatever
    # else the second reads from before the cut (a residual); the rest it hands over itself
    pair_feed = {**a_feed, **{k: v for k, v in b_feed.items() if k not in a_seg.outputs}}
    pair = CompiledPlan([CompiledSegment(str(src), cut - 1, cut, a_seg, a_exe, 0.0),
                         CompiledSegment(str(dst), cut, cut + 1, b_seg, b_exe, 0.0)],
                        b_seg.outputs)
    try:
        t0 = time.perf_counter()
        pair.run(pair_feed)
        one = max((time.perf_counter() - t0) * 1e3, 1e-3)
        calls = max(1, min(MAX_CALLS, int(BURST_MS / one)))
        variants: list[Callable[[], object]] = [lambda: pair.run(pair_feed),
                                                lambda: a_exe.run(a_feed),
                                                lambda: b_exe.run(b_feed)]
        residuals = []
        for r in range(rounds):
            ms = [0.0, 0.0, 0.0]
            for k in (r % 3, (r + 1) % 3, (r + 2) % 3):  # each variant first in turn
                ms[k] = burst_ms(variants[k], calls)
            residuals.append(ms[0] - ms[1] - ms[2])
        return statistics.median(residuals)
    except EdgepilotError:
        return None
    finally:
        pair.close()


def pair_costs(targets: Sequence[str], samples: Sequence[Mapping[str, Any]],
               bandwidth: float) -> list[list[float]] | None:
    """Each (source, destination) target pair's fixed hop cost in ms from the measured
    ``samples`` (see the module docstring): the median over its kind's samples of the hop
    measured less its bytes' copy time; 0 for a kind not measured (None: none is)."""
    fixed: dict[str, list[float]] = {}
    for s in samples:
        if s.get("ms") is not None:
            fixed.setdefault(str(s["kind"]), []).append(
                float(s["ms"]) - float(s["bytes"]) / max(bandwidth, 1.0))
    if not fixed:
        return None
    by_kind = {k: statistics.median(v) for k, v in fixed.items()}
    return [[0.0 if a == b else by_kind.get(hop_kind(a, b), 0.0) for b in targets]
            for a in targets]
