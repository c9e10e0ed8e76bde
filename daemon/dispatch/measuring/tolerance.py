"""The output-error metric plans are held to: scale-free, against the fp32 reference.

``rel_l2`` is ``||out - ref|| / ||ref||`` and ``cosine`` is ``1 - cos(out, ref)``; for a model
with several outputs the worst one counts. A model's budget is its ``[[models]] tolerance`` or
``[dispatch] tolerance`` (default 0.05 relative L2, i.e. 5% of the output's energy).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from edgepilot.errors import ConfigError

METRICS = ("rel_l2", "cosine")
# a plan that mixes in another precision is kept only this far inside its budget: its error is
# measured on calibration inputs (generated where no real samples were given), and real
# requests took a 9-segment int8/fp32 plan checked at 0.048 to 0.059 (tolerance 0.05)
PLAN_MARGIN = 0.8
_EPS = 1e-12


def _norm(v: np.ndarray) -> float:
    """L2 norm without BLAS: on a loaded board BLAS's own threads made one norm of a
    400k-element activation take 20 ms (the profiler compares thousands of them)."""
    return float(np.sqrt(np.sum(v * v)))


def tensor_error(out: np.ndarray, ref: np.ndarray, metric: str = "rel_l2") -> float:
    """Error of one tensor against its reference in ``metric``. A tensor of strings (or
    other objects: a tokenizer's or a label lookup's output) has no magnitude: 0 when equal
    everywhere, else infinite."""
    if not _numeric(out) or not _numeric(ref):
        x, y = np.asarray(out), np.asarray(ref)
        return 0.0 if x.shape == y.shape and bool(np.all(x == y)) else float("inf")
    a, b = _floats(out), _floats(ref)
    if a.shape != b.shape:
        return float("inf")
    with np.errstate(invalid="ignore", over="ignore"):
        err = _error(a, b, metric)
    if np.isfinite(err):
        return err
    # a non-finite value somewhere (checked only then: this runs thousands of times a plan).
    # An attention mask's -inf: equal non-finite values agree and weigh nothing (inf - inf is
    # NaN); a non-finite value where the other side differs is an infinite error
    finite = np.isfinite(a) & np.isfinite(b)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    if not (same | finite).all():
        return float("inf")
    return _error(np.where(finite, a, 0.0), np.where(finite, b, 0.0), metric)


def _numeric(t: np.ndarray) -> bool:
    return np.asarray(t).dtype.kind in "biufc"


def _floats(t: np.ndarray) -> np.ndarray:
    """Flat float64 values; a complex tensor's real then imaginary parts (an RFFT's)."""
    x = np.asarray(t)
    if x.dtype.kind == "c":
        return np.concatenate([x.real.ravel(), x.imag.ravel()]).astype(np.float64)
    return x.astype(np.float64, copy=False).ravel()


def _error(a: np.ndarray, b: np.ndarray, metric: str) -> float:
    if metric == "rel_l2":
        return float(_norm(a - b) / max(_norm(b), _EPS))
    if metric == "cosine":
        denom = max(_norm(a) * _norm(b), _EPS)
        return float(np.maximum(0.0, 1.0 - float(np.sum(a * b)) / denom))  # NaN stays NaN
    raise ConfigError(f"unknown error metric {metric!r}; allowed: {', '.join(METRICS)}",
                      field="dispatch.metric")


def output_error(out: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray],
                 metric: str = "rel_l2") -> float:
    """Worst error over the reference's tensors; a missing tensor is an infinite error."""
    worst = 0.0
    for name, r in ref.items():
        if name not in out:
            return float("inf")
        worst = max(worst, tensor_error(out[name], r, metric))
    return worst


def unchecked(ref: Mapping[str, np.ndarray], names: Iterable[str]) -> str | None:
    """The first of ``names`` whose reference tensor is floating point with no finite value:
    another precision that is NaN there too reads as error 0, a check of nothing (swift-f0 on
    generated inputs, fmin = fmax: every pitch NaN, its int8 "within tolerance")."""
    for name in names:
        arr = np.asarray(ref.get(name, np.zeros(1)))
        if arr.dtype.kind in "fc" and arr.size and not np.isfinite(arr).any():
            return name
    return None
