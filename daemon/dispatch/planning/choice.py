"""From a cost table to a :class:`Plan`: the planner's choice, a published plan's segments
taken as they are, and the per-layer explanation both carry (what `edgepilot plan --json`
shows); then the plan compiled, one executable per segment."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edgepilot.backends.base import Backend, Executable, Target
from edgepilot.dispatch.execution.executor import CompiledPlan, CompiledSegment
from edgepilot.dispatch.graph.partition import Partition
from edgepilot.dispatch.graph.signature import signature_of
from edgepilot.dispatch.measuring.hops import hop_kind
from edgepilot.dispatch.planning.plan import CostBuilder, Plan
from edgepilot.dispatch.planning.planner import CostTable, merge, plan_cost, runner_up
from edgepilot.errors import EdgepilotError, PlanError

log = logging.getLogger(__name__)


class SegmentUnbuildable(PlanError):
    """A plan's segment its target cannot build, though each of its layers was measured on
    that target alone (a variant recipe that fails on the operators merged into it)."""

    def __init__(self, message: str, target: str, start: int, end: int) -> None:
        super().__init__(message, field="targets")
        self.target, self.start, self.end = target, start, end


def compiled_choice(name: str, builder: CostBuilder, part: Partition,
                    backends: Mapping[str, Backend], reason: str, reference: str,
                    keep: list[tuple[str, int, int]] | None = None,
                    figures: Sequence[Any] | None = None, spare: Executable | None = None
                    ) -> tuple[Plan, CompiledPlan]:
    """The plan (``keep``: these segments, ``figures`` their layers', as :func:`given`; else
    :func:`choose`), compiled. A segment that does not build on its target is a planning
    fact, not an abort: its layers go to ``reference`` and the plan is chosen again (an
    ai.onnx.ml model's int8 variant failed in the quantizer for the segment the plan merged,
    after its layers had run on int8 apart, and the model was never planned)."""
    while True:
        plan = (given(name, builder, keep, reason, figures) if keep else None) \
            or choose(name, builder, reason)
        try:
            return plan, compile_plan(part, builder, backends, plan, spare)
        except SegmentUnbuildable as exc:
            if exc.target == reference:
                raise
            log.info("plan for %s: %s; layers %d-%d back to %s", name, exc.message,
                     exc.start, exc.end - 1, reference)
            builder.forced.update(dict.fromkeys(range(exc.start, exc.end), reference))
            keep, spare = None, None


def choose(name: str, builder: CostBuilder, reason: str = "initial") -> Plan:
    """Run the planner on the builder's current costs and describe the result."""
    assign, cost, table = builder.best()
    return describe(name, builder, assign, cost, table, reason)


HopMeter = Callable[[str, str, int], float | None]


def measure_hops(builder: CostBuilder, meter: HopMeter,
                 progress: Callable[[int, int, str], None] | None = None,
                 rounds: int = 3) -> int:
    """Measure each kind of hop the planner's choice makes that this profile has not measured
    (``meter(src, dst, cut)``: ms, None when it cannot be), at the cut it is made, then choose
    again on the measured costs, until the choice makes no unmeasured kind of hop (at most
    ``rounds`` times). The samples join the profile (``extra["hops"]``); returns how many."""
    samples: list[dict[str, Any]] = builder.profile.extra.setdefault("hops", [])
    added = 0
    for _ in range(rounds):
        assign, _, table = builder.best()
        runs = merge(assign)
        known = {s["kind"] for s in samples}
        todo = []
        for k in range(1, len(runs)):
            src, dst, cut = table.targets[runs[k - 1][0]], table.targets[runs[k][0]], runs[k][1]
            if (kind := hop_kind(src, dst)) not in known:
                known.add(kind)
                todo.append((kind, src, dst, cut))
        if not todo:
            break
        for kind, src, dst, cut in todo:
            if progress:
                progress(added + 1, added + len(todo), f"hop {kind} before layer {cut}")
            ms = meter(src, dst, cut)
            samples.append({"kind": kind, "from": src, "to": dst, "layer": cut,
                            "bytes": builder.part.boundary_bytes(cut),
                            "ms": None if ms is None else round(ms, 5)})
            added += 1
    return added


def given(name: str, builder: CostBuilder, segments: list[tuple[str, int, int]],
          reason: str, figures: Sequence[Any] | None = None) -> Plan | None:
    """The plan of ``segments`` as they are (a plan a board of the same kind published: what
    it decided, its side-by-side check against a single target included, is not decided
    again); None when they do not cover this builder's layers with its targets. ``figures``:
    the published plan's per-layer entries, whose cost-model figures are shown as they are
    (the models fitted on the same profile would say the same)."""
    table = builder.table()
    assign: list[int] = []
    for target, start, end in segments:
        if target not in table.targets or start != len(assign):
            return None
        assign += [table.targets.index(target)] * (end - start)
    if len(assign) != len(builder.part.layers):
        return None
    cost = builder.plan_ms(table, assign)
    if cost == float("inf") and len(segments) == 1:  # the whole file, as best() falls back to
        cost = float(builder.profile.extra.get("whole_ms", {}).get(segments[0][0], cost))
    return describe(name, builder, assign, cost, table, reason, figures)


def describe(name: str, builder: CostBuilder, assign: list[int], cost: float,
             table: CostTable, reason: str, figures: Sequence[Any] | None = None) -> Plan:
    """The :class:`Plan` of one assignment (target index per layer) on ``table``; the layers'
    ``roofline_ms`` from ``figures`` (a published plan's layers) when given."""
    names = [table.targets[t] for t in assign]
    shown = _figures(figures, len(assign))
    layers = []
    for i, t in enumerate(assign):
        target = table.targets[t]
        cell = builder.profile.cells[i][target]
        row = builder.profile.cells[i]
        twins = [k for k, other in enumerate(table.targets) if other in row
                 and (row[other].same_as == target or cell.same_as == other)]
        ru = runner_up(table, i, t, twins)
        roof = shown[i] if shown is not None else builder.predicted_layer(i, target)
        used = table.layer_ms[i][t]
        layers.append({
            "name": builder.part.layers[i].name, "target": target,
            # what the planner charged (net of per-call overhead, clock- and drift-scaled)
            "predicted_ms": None if used is None else round(used, 4),
            "measured_ms": None if cell.ms is None else round(cell.ms, 4),
            "roofline_ms": None if roof is None else round(roof, 4),
            "error": cell.error,
            "runner_up": None if ru is None else {"target": table.targets[ru[0]],
                                                  "predicted_ms": round(ru[1], 4)},
        })
    runs = merge(assign)
    segments = [(table.targets[t], s, e) for t, s, e in runs]
    raw = plan_cost(table, assign)
    extra = builder.profile.extra
    hops = [{"layer": s, "from": table.targets[runs[k - 1][0]], "to": table.targets[t],
             "kind": hop_kind(table.targets[runs[k - 1][0]], table.targets[t]),
             "bytes": builder.part.boundary_bytes(s),
             "predicted_ms": round(table.hop(s, runs[k - 1][0], t), 4)}
            for k, (t, s, _) in enumerate(runs) if k]
    return Plan(name, builder.part.model_hash, names, segments, cost, layers, reason=reason,
                uncalibrated_ms=raw if raw < float("inf") else None,
                calibration=builder.calibration.summary(segments, len(builder.part.layers)),
                signature=signature_of(builder.part.shapes),
                exclusions=list(extra.get("excluded", [])), merged=list(extra.get("merged", [])),
                hops=hops)


def _figures(figures: Sequence[Any] | None, n: int) -> list[float | None] | None:
    """Each layer's ``roofline_ms`` from a published plan's layers (None: not one per layer)."""
    if not isinstance(figures, list) or len(figures) != n:
        return None
    out: list[float | None] = []
    for entry in figures:
        value = entry.get("roofline_ms") if isinstance(entry, dict) else None
        if value is not None and not (isinstance(value, int | float) and math.isfinite(value)):
            return None
        out.append(None if value is None else float(value))
    return out


def compile_plan(part: Partition, builder: CostBuilder, backends: Mapping[str, Backend],
                 plan: Plan, spare: Executable | None = None) -> CompiledPlan:
    """One executable per segment of ``plan``, each with its calibrated prediction. ``spare``:
    an open executable of the whole model (the reference's for an adopted plan, the fastest
    whole model the profile timed), used (not built again) when the plan is the whole model
    on its target; closed first otherwise (two big models' sessions are not held at once)."""
    table = builder.table()
    if spare is not None and not any((s, e) == (0, len(part.layers)) and
                                     spare.target == Target.parse(t)
                                     for t, s, e in plan.segments):
        spare.close()
        spare = None
    segs: list[CompiledSegment] = []
    for (target, s, e), pred in zip(plan.segments,
                                    builder.segment_predictions(table, plan.segments),
                                    strict=True):
        # [0, n) is Segment(layers=None): the original file, the model's own inputs and
        # outputs, the same variant recipe a single-target load uses (test_executor.py)
        seg = part.segment(s, e)
        t = Target.parse(target)
        if spare is not None and (s, e) == (0, len(part.layers)) and spare.target == t:
            exe, spare = spare, None
        elif t.backend in backends:
            try:
                exe = backends[t.backend].compile(seg, t)
            except EdgepilotError as exc:
                for done in segs:
                    done.exe.close()
                raise SegmentUnbuildable(f"{target} cannot build layers {s}-{e - 1} together: "
                                         f"{exc.message}", target, s, e) from None
        else:
            raise PlanError(f"backend {t.backend!r} is not loaded; loaded: "
                            f"{', '.join(backends)}", field="targets")
        segs.append(CompiledSegment(target, s, e, seg, exe, pred))
    if spare is not None:
        spare.close()
    return CompiledPlan(segs, part.outputs)
