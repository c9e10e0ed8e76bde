"""Per-(target, op type) latency predictors fitted on a kernel corpus (see ``corpus.py``).

nn-Meter's idea at small scale: a layer is a few operators run in one call, so its latency is
``call + sum of its operators' kernel times``, and each operator type's kernel time is learned
from a sweep of synthetic single-operator models timed on the board. Two layers that share no
shape are then still predicted from the same dense sweep, instead of from a handful of other
layers of the model.

A :class:`KernelFit` (one target, one op family) is an additive model
``overhead + a*flops + b*weight_bytes + c*activation_bytes`` (non-negative, fitted on relative
residuals) times a residual correction interpolated over the sweep in log-feature space (inverse
squared distance over the nearest points). On the sweep points themselves the prediction is the
measurement; when the cost really is additive the additive part alone is exact everywhere.

:func:`layer_prediction` multiplies the kernel sum by a per-(target, op class) correction fitted
on the model's *other* measured layers: what a compiled layer does differently from its kernels
alone (fusion, cache reuse between operators).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgepilot.backends.base import Target
from edgepilot.dispatch.measuring.measure import Progress
from edgepilot.dispatch.planning.costmodel import nnls_relative
from edgepilot.errors import EdgepilotError

log = logging.getLogger(__name__)

# operators ORT removes or turns into views: no kernel of their own
FREE_OPS = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Constant",
                      "Dropout"})
# operators with a sweep of their own; any other operator is priced as an elementwise Add
SWEPT_OPS = frozenset({"Add", "Mul", "Relu", "Softmax", "LayerNormalization", "Transpose",
                       "MaxPool", "Conv"})
_NEAREST = 4
# the net kernel time is never taken below this (ms): a kernel faster than the timer's noise
_MIN_NET_MS = 1e-4


def family_of(op: str, weight_bytes: int) -> str | None:
    """The corpus family an operator is predicted from (None: free)."""
    if op in FREE_OPS:
        return None
    if op in ("MatMul", "Gemm", "FusedMatMul"):
        # a MatMul with a weight matrix is quantized by int8/int4 recipes; one between two
        # activations (attention scores) is not: they are different kernels
        return "MatMul" if weight_bytes else "MatMulAct"
    if op in SWEPT_OPS:
        return op
    return "Add"


@dataclass(frozen=True)
class OpFeatures:
    """What one operator is predicted from (bytes of its non-constant inputs and outputs)."""

    family: str
    flops: float
    weight_bytes: float
    in_bytes: float
    out_bytes: float

    def vector(self) -> np.ndarray:
        return np.log1p(np.array([self.flops, self.weight_bytes, self.in_bytes,
                                  self.out_bytes], dtype=float))


@dataclass(frozen=True)
class KernelPoint:
    """One timed corpus kernel: its features and its time net of the per-call cost."""

    kernel: str
    features: OpFeatures
    ms: float

    def as_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "ms": self.ms, **asdict(self.features)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KernelPoint:
        feats = OpFeatures(str(data["family"]), float(data["flops"]),
                           float(data["weight_bytes"]), float(data["in_bytes"]),
                           float(data["out_bytes"]))
        return cls(str(data["kernel"]), feats, float(data["ms"]))


def _columns(f: OpFeatures) -> list[float]:
    return [1.0, f.flops, f.weight_bytes, f.in_bytes + f.out_bytes]


@dataclass
class KernelFit:
    """One (target, family) predictor; see the module docstring."""

    coef: tuple[float, ...]
    points: list[tuple[np.ndarray, float]] = field(default_factory=list)  # (log features, log r)

    def additive(self, f: OpFeatures) -> float:
        return max(float(np.dot(_columns(f), self.coef)), _MIN_NET_MS)

    def predict(self, f: OpFeatures) -> float:
        base = self.additive(f)
        if not self.points:
            return base
        x = f.vector()
        dist = np.array([float(np.linalg.norm(x - p)) for p, _ in self.points])
        resid = np.array([r for _, r in self.points])
        exact = dist < 1e-9
        if exact.any():
            return base * math.exp(float(resid[exact][0]))
        idx = np.argsort(dist)[:_NEAREST]
        w = 1.0 / dist[idx] ** 2
        return base * math.exp(float(np.dot(w, resid[idx]) / w.sum()))


def fit_family(points: Sequence[KernelPoint]) -> KernelFit:
    """Fit one family's :class:`KernelFit` on its corpus points (at least one)."""
    if not points:
        raise ValueError("cannot fit a kernel family without corpus points")
    x = np.array([_columns(p.features) for p in points], dtype=float)
    y = np.array([max(p.ms, _MIN_NET_MS) for p in points])
    fit = KernelFit(tuple(float(c) for c in nnls_relative(x, y)))
    fit.points = [(p.features.vector(), math.log(max(p.ms, _MIN_NET_MS) / fit.additive(
        p.features))) for p in points]
    return fit


@dataclass
class KernelModel:
    """Every family's fit for one target, plus its per-call cost."""

    target: str
    call_ms: float
    fits: dict[str, KernelFit]

    def op_ms(self, f: OpFeatures) -> float | None:
        fit = self.fits.get(f.family) or (self.fits.get("Add") if f.family in SWEPT_OPS
                                          else None)
        return None if fit is None else fit.predict(f)

    def layer_ms(self, ops: Iterable[OpFeatures]) -> float | None:
        """``call + sum of kernels``; None when a family has no fit for this target."""
        total = self.call_ms
        for f in ops:
            ms = self.op_ms(f)
            if ms is None:
                return None
            total += ms
        return total


def fit_model(target: str, call_ms: float, points: Sequence[KernelPoint]) -> KernelModel:
    by_family: dict[str, list[KernelPoint]] = {}
    for p in points:
        by_family.setdefault(p.features.family, []).append(p)
    return KernelModel(target, call_ms, {fam: fit_family(ps) for fam, ps in by_family.items()})


def correction(kernel_ms: Sequence[float | None], measured_ms: Sequence[float | None],
                classes: Sequence[str], held: int) -> float:
    """measured/kernel-sum expected for layer ``held``, from the *other* layers only.

    Geometric mean of the ratio over the other measured layers of the same op class; none:
    over all other measured layers; none at all: 1.0. Layer ``held``'s own measurement is never
    read. The ratio carries what the corpus cannot know: how the board runs *now* compared with
    when the corpus was timed (clocks, load) and what compiling operators together changes.
    """
    same: list[float] = []
    other: list[float] = []
    for j, (k, m, c) in enumerate(zip(kernel_ms, measured_ms, classes, strict=True)):
        if j == held or k is None or m is None or k <= 0 or m <= 0:
            continue
        (same if c == classes[held] else other).append(math.log(m / k))
    logs = same or other
    return math.exp(statistics.fmean(logs)) if logs else 1.0


# (targets, progress) -> kernel models per target name (the dispatcher's CorpusStore)
CorpusProvider = Callable[[list[Target], Progress | None], dict[str, "KernelModel"]]


def corpus_fits(corpus: CorpusProvider | None, targets: list[Target],
                progress: Progress | None) -> dict[str, KernelModel]:
    """The targets' kernel-corpus fits (measured on a board's first plan, then cached); {}
    without a corpus or when it cannot be had (predictions then rest on the layer fits)."""
    if corpus is None:
        return {}
    try:
        return corpus(targets, progress)
    except EdgepilotError as exc:
        log.warning("kernel corpus unavailable, predicting from layer fits: %s", exc.message)
        return {}

