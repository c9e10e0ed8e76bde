"""From measurements to a plan: cost tables, the chosen assignment, and its explanation.

:class:`CostBuilder` turns a :class:`LatencyTable` into the planner's :class:`CostTable`:
measured layer times net of the per-call overhead (which the planner charges once per segment),
hops as ``overhead(dst) + boundary bytes / bandwidth`` plus what that kind of hop was measured
to cost beyond the copy (``measuring/hops.py``), targets over the error budget or
excluded after a fault marked ineligible, per-target factors (drift), frequency scaling from the
fitted roofline models, and the per-target segment calibration (``calibration.py``).
:class:`Plan` is the result and its JSON shape (what `edgepilot plan --json` prints); the
choice itself is made in ``choice.py``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from edgepilot.backends.base import Target
from edgepilot.dispatch.graph.partition import Layer, Partition
from edgepilot.dispatch.measuring.calibration import Calibration, Observation
from edgepilot.dispatch.measuring.cells import LatencyTable
from edgepilot.dispatch.measuring.hops import pair_costs
from edgepilot.dispatch.planning import costmodel
from edgepilot.dispatch.planning.corpus import layer_ops
from edgepilot.dispatch.planning.costmodel import LinearCost, Roofline, Sample
from edgepilot.dispatch.planning.kernels import KernelModel, correction
from edgepilot.dispatch.planning.planner import (
    CostTable,
    merge,
    prefer_reference,
    prefer_single,
    solve,
)
from edgepilot.errors import PlanError

# a layer never costs less than this share of its standalone time, whatever the overhead says
_MIN_NET_SHARE = 0.05


def device_of(target: str) -> str:
    """The physical device a target's memory lives on (for budgets)."""
    t = Target.parse(target)
    dev = t.device.lower()
    if dev in ("cpu", "cpu-1t", "xnnpack", "cpuref", "cpuacc", "dnnl", "acl", "armnn"):
        return "cpu"
    if dev in ("cuda", "tensorrt", "gpu", "gpuacc", "webgpu", "opencl"):
        return "gpu"
    return dev  # qnn, nnapi, rknpu ... their own device


@dataclass
class CostBuilder:
    """Builds cost tables; holds what changes between replans (exclusions, drift, clocks)."""

    part: Partition
    profile: LatencyTable
    tolerance: float
    excluded: set[str] = field(default_factory=set)
    factors: dict[str, float] = field(default_factory=dict)   # observed/predicted drift
    forced: dict[int, str] = field(default_factory=dict)      # repair: layer -> reference
    freqs: dict[str, float] = field(default_factory=dict)     # device -> kHz now
    budgets: dict[str, float] = field(default_factory=dict)
    rooflines: dict[str, Roofline] = field(default_factory=dict)
    linear: dict[tuple[str, str], LinearCost] = field(default_factory=dict)
    calibration: Calibration = field(default_factory=lambda: Calibration([]))
    split_margin: float = 0.05  # a split must beat the best single target by this fraction
    kernels: dict[str, KernelModel] = field(default_factory=dict)  # target -> corpus fit
    # the cost models are fitted on first use: a plan adopted as published never needs them
    fitted: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self._seed_calibration()

    def _seed_calibration(self) -> None:
        """Observations saved with the profile, else each target's whole-model timing."""
        saved = self.profile.extra.get("segments")
        if saved:
            self.calibration = Calibration.from_list(saved)
            return
        n = len(self.part.layers)
        for target, ms in sorted(self.profile.extra.get("whole_ms", {}).items()):
            pred = self.raw_segment_ms(target, 0, n)
            if pred is not None:
                self.calibration.add(Observation(target, 0, n, pred, float(ms), "profile"))
        self.profile.extra["segments"] = self.calibration.as_list()

    def raw_segment_ms(self, target: str, start: int, end: int) -> float | None:
        """Uncalibrated prediction of one compiled segment: its layers plus one call.

        Each layer costs what the planner's table charges for it (:meth:`cell_ms`), so the
        ratio an observation keeps (measured / this sum) multiplies the same sum it was taken
        on: a single-target plan is then predicted by its whole model's timing itself. When
        the two sums differed (the table's twin timings, the raw cells here), mtcnn-pnet's
        int4 plan was predicted at 1.69 ms from a whole-model timing of 6.36 ms."""
        total = self.profile.overhead_ms.get(target, 0.0) * self.factors.get(target, 1.0)
        for i in range(start, end):
            ms = self.cell_ms(i, target)
            if ms is None:
                return None
            total += self._net(i, target, ms)
        return total

    def record(self, segments: list[tuple[str, int, int]], measured_ms: list[float],
               source: str = "plan") -> None:
        """Keep per-segment end-to-end times (a plan's check, or segments timed alone) for the
        next predictions."""
        for (target, s, e), ms in zip(segments, measured_ms, strict=True):
            pred = self.raw_segment_ms(target, s, e)
            if pred is not None:
                self.calibration.add(Observation(target, s, e, pred, ms, source))
        self.profile.extra["segments"] = self.calibration.as_list()

    def samples(self, target: str) -> list[Sample]:
        prec = Target.parse(target).precision
        out = []
        for layer, row in zip(self.part.layers, self.profile.cells, strict=True):
            cell = row.get(target)
            if cell is not None and cell.ms is not None:
                out.append(self.sample(layer, prec, cell.ms))
        return out

    @staticmethod
    def sample(layer: Layer, precision: str, ms: float = 0.0) -> Sample:
        return Sample(layer.flops, costmodel.layer_bytes(
            layer.weight_bytes, layer.in_bytes, layer.out_bytes, precision), ms,
            act_bytes=layer.in_bytes + layer.out_bytes, nodes=layer.end - layer.start)

    def class_samples(self, target: str) -> dict[str, list[Sample]]:
        """Measured samples of ``target`` grouped by op class (conv, gemm, other)."""
        prec = Target.parse(target).precision
        out: dict[str, list[Sample]] = {}
        for layer, row in zip(self.part.layers, self.profile.cells, strict=True):
            cell = row.get(target)
            if cell is not None and cell.ms is not None:
                out.setdefault(costmodel.op_class(layer.op_types), []).append(
                    self.sample(layer, prec, cell.ms))
        return out

    def fit(self) -> None:
        """Fit the per-target cost models on the profile (a shell partition is cut first)."""
        self.part.real()
        self.fitted = True
        for target in self.profile.targets:
            freq = self.profile.freqs.get(device_of(target), 0.0)
            samples = self.samples(target)
            if samples:
                self.rooflines[target] = costmodel.fit(samples, freq)
            for cls, group in self.class_samples(target).items():
                if len(group) >= 3:  # fewer: the target-wide roofline predicts this class
                    self.linear[(target, cls)] = costmodel.fit_linear(group, freq)

    def kernel_sum(self, i: int, target: str) -> float | None:
        """Layer ``i`` as the call cost plus its operators' corpus kernels (None: no corpus)."""
        model = self.kernels.get(target)
        return None if model is None else model.layer_ms(layer_ops(self.part, i))

    def kernel_prediction(self, i: int, target: str) -> float | None:
        """Corpus prediction of layer ``i``: kernel sum times the measured/kernel ratio of the
        model's *other* layers of its op class on ``target`` (layer ``i`` is never read)."""
        own = self.kernel_sum(i, target)
        if own is None:
            return None
        sums = [self.kernel_sum(j, target) for j in range(len(self.part.layers))]
        measured = [row[target].ms if target in row else None for row in self.profile.cells]
        classes = [costmodel.op_class(lay.op_types) for lay in self.part.layers]
        return own * correction(sums, measured, classes, i)

    def predicted_layer(self, i: int, target: str) -> float | None:
        """Model prediction for layer ``i`` on ``target`` at the current frequency: the kernel
        corpus when the target has one, else the (target, op class) additive fit when there is
        one, else the target's roofline."""
        if not self.fitted:
            self.fit()
        layer = self.part.layers[i]
        prec = Target.parse(target).precision
        now = self.freqs.get(device_of(target), 0.0)
        kernel = self.kernel_prediction(i, target)
        if kernel is not None:
            return kernel * self.factors.get(target, 1.0) * self.freq_scale(target, i)
        linear = self.linear.get((target, costmodel.op_class(layer.op_types)))
        if linear is not None:
            return linear.predict(self.sample(layer, prec), now) * self.factors.get(target, 1.0)
        model = self.rooflines.get(target)
        if model is None:
            return None
        nbytes = costmodel.layer_bytes(layer.weight_bytes, layer.in_bytes, layer.out_bytes, prec)
        return model.predict(layer.flops, nbytes, now) * self.factors.get(target, 1.0)

    def freq_scale(self, target: str, i: int) -> float:
        """How much slower layer ``i`` is predicted to be now than when it was measured."""
        freq = self.freqs.get(device_of(target), 0.0)
        if freq <= 0 or freq == self.profile.freqs.get(device_of(target), 0.0):
            return 1.0  # the clock it was measured at (no model needed to say so)
        if not self.fitted:
            self.fit()
        model = self.rooflines.get(target)
        if model is None or model.fit_freq_khz <= 0:
            return 1.0
        layer = self.part.layers[i]
        nbytes = costmodel.layer_bytes(layer.weight_bytes, layer.in_bytes, layer.out_bytes,
                                       Target.parse(target).precision)
        then = model.predict(layer.flops, nbytes)
        now = model.predict(layer.flops, nbytes, freq)
        return now / then if then > 0 else 1.0

    def segment_ms(self, table: CostTable, t: int, start: int, end: int,
                   src: int | None = None) -> float:
        """Calibrated prediction of one compiled segment, the hop into it from target ``src``
        (the previous segment's) included."""
        raw = sum(table.layer_ms[i][t] or 0.0 for i in range(start, end)) + table.enter_ms[t]
        f = self.calibration.factor(table.targets[t], start, end, len(self.part.layers))
        return raw * f + (table.hop(start, src, t) if src is not None else 0.0)

    def plan_ms(self, table: CostTable, assign: list[int]) -> float:
        """Calibrated prediction of a whole assignment (inf when a layer is not eligible)."""
        if any(table.layer_ms[i][t] is None for i, t in enumerate(assign)):
            return float("inf")
        return sum(self.segment_predictions(table, [(table.targets[t], s, e)
                                                    for t, s, e in merge(assign)]))

    def segment_predictions(self, table: CostTable,
                            segments: list[tuple[str, int, int]]) -> list[float]:
        """:meth:`segment_ms` of each of a plan's ``(target, start, end)`` in order."""
        at = [table.targets.index(t) for t, _, _ in segments]
        return [self.segment_ms(table, at[k], s, e, at[k - 1] if k else None)
                for k, (_, s, e) in enumerate(segments)]

    def best(self) -> tuple[list[int], float, CostTable]:
        """The DP's assignment and its calibrated prediction.

        The choice is made on the profiled layer costs alone: a calibration ratio rests on one
        or a few end-to-end timings, and letting one noisy timing of a whole model decide the
        plan once put transformer on fp32 (3.4x slower than int8) on this shared board.
        """
        self.part.real()  # a shell's layers have no boundary sizes to choose cuts by
        table = self.table()
        try:
            assign, _ = solve(table)
        except PlanError:
            # some layer runs on no eligible target alone: the whole model, as a runtime runs
            # the file, is always a candidate
            whole = self.best_whole()
            if whole is None:
                raise
            return [table.targets.index(whole)] * table.n_layers, \
                float(self.profile.extra["whole_ms"][whole]), table
        assign = prefer_reference(table, prefer_single(table, assign, self.split_margin),
                                  self.profile.reference, self.split_margin)
        return assign, self.plan_ms(table, assign), table

    def best_whole(self) -> str | None:
        """The fastest target whose whole-model run is within tolerance (None: none is)."""
        whole = self.profile.extra.get("whole_ms", {})
        errors = self.profile.extra.get("whole_error", {})
        ok = [t for t in self.profile.targets if t in whole and t not in self.excluded
              and errors.get(t, 0.0) <= self.tolerance]
        return min(ok, key=lambda t: whole[t]) if ok else None

    def eligible(self, i: int, target: str) -> bool:
        if target in self.excluded:
            return False
        if i in self.forced:
            return target == self.forced[i]
        cell = self.profile.cells[i].get(target)
        if cell is None or cell.ms is None or cell.error is None:
            return False
        if cell.error <= self.tolerance:
            return True
        # a layer's error is measured on its own outputs, where it can look far larger than
        # what reaches the model's output (a residual sum before its LayerNorm: MiniLM's int8
        # FFN layers measure 0.08-0.12 while the whole int8 model is 0.014). A target whose
        # whole model is within tolerance stays eligible; the plan's end-to-end check, which
        # moves the worst layers back to the reference, is what guarantees the tolerance.
        whole = self.profile.extra.get("whole_error", {}).get(target)
        return whole is not None and whole <= self.tolerance

    def layer_ms(self, i: int, target: str) -> float | None:
        """Net cost of layer ``i`` inside a segment on ``target`` (None when not eligible)."""
        if not self.eligible(i, target):
            return None
        ms = self.cell_ms(i, target)
        assert ms is not None
        return self._net(i, target, ms)

    def cell_ms(self, i: int, target: str) -> float | None:
        """Layer ``i``'s timing on ``target`` as costs are built from it: its own, or the lower
        timing of a twin computing exactly the same (:meth:`_twins`); None: not timed."""
        cell = self.profile.cells[i].get(target)
        if cell is None or cell.ms is None:
            return None
        return min([cell.ms, *self._twins(i, target)])

    def _twins(self, i: int, target: str) -> list[float]:
        """Timings of layer ``i`` on the targets that compute exactly what ``target`` does.

        A precision variant that leaves a layer as it is (int4 quantizes MatMuls only: every
        convolution of a CNN is the fp32 kernel) gives the reference's outputs bit for bit
        (error exactly 0) on the same runtime and device. Two timings of one computation differ
        only by noise, and load only ever adds time: both targets get the lower one, so the
        planner never prefers a variant (and its quantization on every board of the kind) for
        layers it did not change, nor splits between two copies of one kernel."""
        ref = self.profile.reference
        cells = self.profile.cells[i]
        where = Target.parse(ref)

        def same(t: str) -> bool:  # runs as the reference runs, on its runtime and device
            other = Target.parse(t)
            return t == ref or (cells[t].error == 0.0 and other.backend == where.backend
                                and other.device == where.device)

        if ref not in cells or not same(target):
            return []
        return [c.ms for t, c in cells.items()
                if t != target and c.ms is not None and same(t) and t not in self.excluded]

    def _net(self, i: int, target: str, ms: float) -> float:
        over = self.profile.overhead_ms.get(target, 0.0)
        net = max(ms - over, ms * _MIN_NET_SHARE)
        return net * self.factors.get(target, 1.0) * self.freq_scale(target, i)

    def table(self) -> CostTable:
        """The planner's layer costs (uncalibrated: see :meth:`plan_ms`)."""
        targets = list(self.profile.targets)
        n = len(self.part.layers)
        bw = max(self.profile.bandwidth_bytes_per_ms, 1.0)
        hop = [0.0] + [self.part.boundary_bytes(i) / bw for i in range(1, n)]
        enter = [self.profile.overhead_ms.get(t, 0.0) * self.factors.get(t, 1.0)
                 for t in targets]
        layer_ms = [[self.layer_ms(i, t) for t in targets] for i in range(n)]
        memory = [[float(self.profile.cells[i][t].memory) for t in targets] for i in range(n)]
        return CostTable(targets, layer_ms, enter, hop, memory,
                         [device_of(t) for t in targets], dict(self.budgets),
                         pair_costs(targets, self.profile.extra.get("hops", []), bw))


@dataclass
class Plan:
    """A chosen assignment, its segments and everything ``explain`` shows."""

    model: str
    model_hash: str
    targets: list[str]          # per layer
    segments: list[tuple[str, int, int]]
    predicted_ms: float
    layers: list[dict[str, Any]]
    measured_ms: float | None = None
    error: float | None = None
    reason: str = "initial"
    uncalibrated_ms: float | None = None     # the same plan as the sum of its layers
    calibration: list[dict[str, Any]] = field(default_factory=list)
    signature: str = ""                      # the input shapes it is for
    # (layer range, target) pairs that could not run, and why (the JSON key "excluded" is
    # already the list of targets taken out after a fault); layers run with a neighbour
    exclusions: list[dict[str, Any]] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    # each hop between segments: before which layer, the targets, the bytes crossing, the
    # cost charged for it (boundary bytes over the measured host copy bandwidth)
    hops: list[dict[str, Any]] = field(default_factory=list)
    versus_single: dict[str, Any] | None = None  # the split timed against one target
    planning_s: float | None = None              # wall time prepare() took

    @property
    def hash(self) -> str:
        """Short, stable id of what runs where, for which input shapes (appears in telemetry
        and events)."""
        key = json.dumps([self.model_hash, self.signature, self.segments],
                         separators=(",", ":"))
        return hashlib.sha256(key.encode()).hexdigest()[:10]

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "hash": self.hash, "signature": self.signature,
            "predicted_ms": round(self.predicted_ms, 4),
            "measured_ms": None if self.measured_ms is None else round(self.measured_ms, 4),
            "error": self.error, "reason": self.reason,
            "predicted_vs_measured": None if not self.measured_ms
            else round(self.predicted_ms / self.measured_ms, 3),
            "uncalibrated_ms": None if self.uncalibrated_ms is None
            else round(self.uncalibrated_ms, 4),
            "calibration": self.calibration,
            "segments": [{"target": t, "layers": [s, e]} for t, s, e in self.segments],
            "exclusions": self.exclusions, "merged": self.merged, "hops": self.hops,
            "versus_single": self.versus_single, "planning_s": self.planning_s,
            "layers": self.layers,
        }


def segments_of(targets: list[str]) -> list[dict[str, Any]]:
    """Consecutive layers on one target as ``{"target", "layers": [first, end)}``."""
    out: list[dict[str, Any]] = []
    for i, target in enumerate(targets):
        if out and out[-1]["target"] == target:
            out[-1]["layers"][1] = i + 1
        else:
            out.append({"target": target, "layers": [i, i + 1]})
    return out
