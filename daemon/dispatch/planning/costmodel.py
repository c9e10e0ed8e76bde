"""Roofline-style latency predictor per target, fitted on measured layers.

``t = max(flops / (compute * s), bytes / bandwidth) + overhead`` where ``s`` is the frequency
of the device the target runs on relative to the frequency at fitting time (1.0 when the board
exposes no cpufreq). ``bytes`` is the layer's weight bytes at the target's precision plus its
boundary bytes. The three parameters are fitted in log space by Nelder-Mead on the squared log
ratio predicted/measured, so a 10% miss on a 20 µs layer weighs as much as one on a 20 ms layer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

# weight bytes relative to fp32 for each precision name the backends use
PRECISION_BYTES = {"fp32": 1.0, "tf32": 1.0, "fp16": 0.5, "bf16": 0.5, "int8": 0.25, "int4": 0.125,
                   "q8_0": 0.27, "q4_k_m": 0.14}


@dataclass(frozen=True)
class Sample:
    """One measured layer on one target (the extra features feed :class:`LinearCost`)."""

    flops: float
    bytes: float
    ms: float
    act_bytes: float = 0.0      # boundary tensors in + out
    nodes: float = 1.0          # graph nodes in the layer (per-kernel launch cost)


def layer_bytes(weight_bytes: int, in_bytes: int, out_bytes: int, precision: str) -> float:
    return weight_bytes * PRECISION_BYTES.get(precision, 1.0) + in_bytes + out_bytes


@dataclass
class Roofline:
    """Fitted parameters of one target: FLOP/ms, bytes/ms, ms per call."""

    compute: float
    bandwidth: float
    overhead: float
    fit_freq_khz: float = 0.0

    def predict(self, flops: float, nbytes: float, freq_khz: float = 0.0) -> float:
        """Predicted ms; ``freq_khz`` (0 = unknown) scales the compute roof."""
        scale = 1.0
        if freq_khz > 0 and self.fit_freq_khz > 0:
            scale = freq_khz / self.fit_freq_khz
        return max(flops / (self.compute * scale), nbytes / self.bandwidth) + self.overhead

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Roofline:
        return cls(**{k: float(v) for k, v in data.items()})


def _nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 1.0,
                 iters: int = 400, tol: float = 1e-10) -> np.ndarray:
    """Plain Nelder-Mead (no scipy on the board)."""
    n = len(x0)
    simplex = [x0.astype(float)]
    for i in range(n):
        x = x0.astype(float).copy()
        x[i] += step
        simplex.append(x)
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        refl = centroid + (centroid - simplex[-1])
        fr = f(refl)
        if fr < values[0]:
            exp = centroid + 2 * (centroid - simplex[-1])
            fe = f(exp)
            simplex[-1], values[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = refl, fr
        else:
            contr = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contr)
            if fc < values[-1]:
                simplex[-1], values[-1] = contr, fc
            else:
                best = simplex[0]
                simplex = [best + 0.5 * (x - best) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]


def fit(samples: Sequence[Sample], freq_khz: float = 0.0) -> Roofline:
    """Fit a :class:`Roofline` to measured samples (at least one)."""
    if not samples:
        raise ValueError("cannot fit a cost model without measurements")
    fl = np.array([max(s.flops, 1.0) for s in samples])
    by = np.array([max(s.bytes, 1.0) for s in samples])
    ms = np.array([max(s.ms, 1e-6) for s in samples])
    floor = float(ms.min())
    o0 = floor * 0.5
    c0 = float(np.median(fl / np.maximum(ms - o0, 1e-6)))
    b0 = float(np.median(by / np.maximum(ms - o0, 1e-6))) * 4

    def loss(x: np.ndarray) -> float:
        # Nelder-Mead may wander far on flat losses (one or two samples): clip, never overflow
        c, b, o = np.exp(np.clip(x, -60.0, 60.0))
        pred = np.maximum(fl / c, by / b) + o
        return float(np.sum(np.log(pred / ms) ** 2))

    best = _nelder_mead(loss, np.log([c0, b0, max(o0, 1e-6)]))
    # a restart from the best point escapes most of Nelder-Mead's early stalls
    best = _nelder_mead(loss, best, step=0.3)
    c, b, o = (float(v) for v in np.exp(np.clip(best, -60.0, 60.0)))
    return Roofline(c, b, o, freq_khz)


def within(pred: float, meas: float, rel: float = 0.10) -> bool:
    return abs(pred - meas) <= rel * meas


def leave_one_out(samples: Sequence[Sample], rel: float = 0.10) -> tuple[int, int, list[float]]:
    """Fit on all but one sample, predict it; ``(hits within ±rel, count, relative errors)``."""
    hits, errors = 0, []
    if len(samples) < 3:
        return 0, 0, []
    for i, held in enumerate(samples):
        model = fit([s for j, s in enumerate(samples) if j != i])
        pred = model.predict(held.flops, held.bytes)
        errors.append((pred - held.ms) / held.ms)
        hits += within(pred, held.ms, rel)
    return hits, len(samples), errors


# ---- additive model, fitted per (target, op class) ----------------------------------------------
# terms a LinearCost may use: per-call overhead, FLOPs, activation bytes, graph nodes
TERMS = ("overhead", "flops", "act_bytes", "nodes")
# the term sets the fit chooses among (by inner leave-one-out on the training samples only)
FORMS: tuple[tuple[str, ...], ...] = (("overhead", "flops"), ("overhead", "flops", "act_bytes"),
                                      ("overhead", "flops", "nodes"), TERMS)


def op_class(ops: Sequence[str]) -> str:
    """Conv and GEMM layers run different kernels: each class gets its own fit."""
    if any(o.startswith(("Conv", "CONV", "DEPTHWISE_CONV")) for o in ops):
        return "conv"
    if any(o in ("MatMul", "Gemm", "FULLY_CONNECTED", "MatMulInteger", "MatMulNBits")
           for o in ops):
        return "gemm"
    return "other"


def _features(s: Sample, terms: Sequence[str], scale: float = 1.0) -> list[float]:
    values = {"overhead": 1.0, "flops": s.flops / scale, "act_bytes": s.act_bytes,
              "nodes": s.nodes}
    return [values[t] for t in terms]


def nnls_relative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on *relative* residuals ((pred - y) / y).

    Exact for the few columns used here: every subset of columns is solved by least squares
    and the best one with all coefficients >= 0 wins (what an active-set NNLS converges to).
    """
    a = x / y[:, None]
    b = np.ones_like(y)
    col_scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    a = a / col_scale
    k = a.shape[1]
    best: tuple[float, np.ndarray] | None = None
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            sol, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if (sol < 0).any():
                continue
            res = float(np.sum((a[:, cols] @ sol - b) ** 2))
            if best is None or res < best[0]:
                coef = np.zeros(k)
                coef[list(cols)] = sol
                best = (res, coef)
    assert best is not None  # a single column always has a non-negative solution here
    return best[1] / col_scale


@dataclass
class LinearCost:
    """``t = overhead + flops * ms_per_flop (clock-scaled) + act_bytes * ms_per_byte + nodes *
    ms_per_node``, non-negative coefficients; ``terms`` says which ones the fit kept."""

    terms: tuple[str, ...]
    coef: tuple[float, ...]
    fit_freq_khz: float = 0.0

    def predict(self, s: Sample, freq_khz: float = 0.0) -> float:
        scale = freq_khz / self.fit_freq_khz if freq_khz > 0 and self.fit_freq_khz > 0 else 1.0
        return float(np.dot(_features(s, self.terms, scale), self.coef))


def _fit_terms(samples: Sequence[Sample], terms: tuple[str, ...], freq_khz: float) -> LinearCost:
    x = np.array([_features(s, terms) for s in samples], dtype=float)
    y = np.array([max(s.ms, 1e-6) for s in samples])
    return LinearCost(terms, tuple(float(c) for c in nnls_relative(x, y)), freq_khz)


def _inner_loo_error(samples: Sequence[Sample], terms: tuple[str, ...]) -> float:
    errs = []
    for i, held in enumerate(samples):
        model = _fit_terms([s for j, s in enumerate(samples) if j != i], terms, 0.0)
        errs.append(abs(math.log(max(model.predict(held), 1e-9) / max(held.ms, 1e-9))))
    return float(np.median(errs))


def fit_linear(samples: Sequence[Sample], freq_khz: float = 0.0) -> LinearCost:
    """Fit a :class:`LinearCost`, choosing its terms by leave-one-out *within* ``samples``.

    More terms fit the training layers better but predict new ones worse when there are few
    of them, so each candidate term set is scored by its own inner leave-one-out error.
    """
    if not samples:
        raise ValueError("cannot fit a cost model without measurements")
    forms = [f for f in FORMS if len(f) < len(samples)] or [FORMS[0]]
    if len(samples) < 4 or len(forms) == 1:
        return _fit_terms(samples, forms[0], freq_khz)
    best = min(forms, key=lambda f: _inner_loo_error(samples, f))
    return _fit_terms(samples, best, freq_khz)


def leave_one_out_linear(samples: Sequence[Sample], rel: float = 0.10
                         ) -> tuple[int, int, list[float]]:
    """:func:`leave_one_out` for :func:`fit_linear`: the held-out layer is never seen, not
    even by the choice of terms."""
    hits, errors = 0, []
    if len(samples) < 3:
        return 0, 0, []
    for i, held in enumerate(samples):
        model = fit_linear([s for j, s in enumerate(samples) if j != i])
        pred = model.predict(held)
        errors.append((pred - held.ms) / held.ms)
        hits += within(pred, held.ms, rel)
    return hits, len(samples), errors
