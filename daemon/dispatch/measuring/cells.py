"""A model's profile: one :class:`Cell` per (layer, target), the whole model's per target,
and what could not run (:func:`exclusions`), as the plan cache stores them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# early elimination: after this many timed runs, a candidate this many times slower than the
# best one measured for the same layer cannot change the decision and is timed no further (nor
# timed again in a later pass); its median of those runs stands. A cell 1.5x its layer's best
# is chosen only where hops cost over half the layer, and then the plan stays on one target.
EARLY_FACTOR = 1.5


@dataclass
class Cell:
    """One (layer, target) measurement; ``ms`` None = not supported (``reason`` says why)."""

    ms: float | None
    error: float | None = None
    memory: int = 0
    reason: str = ""
    # the target whose compiled segment this one's is, byte for byte, on the same device (an
    # int4 recipe of a graph with no MatMul changes nothing): its figures, not timed again
    same_as: str | None = None


@dataclass
class LatencyTable:
    """All measurements of one model on one board, serialisable into the plan cache."""

    targets: list[str]
    reference: str
    cells: list[dict[str, Cell]]
    overhead_ms: dict[str, float]
    bandwidth_bytes_per_ms: float
    freqs: dict[str, float] = field(default_factory=dict)  # device -> kHz when measured
    metric: str = "rel_l2"
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cells"] = [{t: asdict(c) for t, c in row.items()} for row in self.cells]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LatencyTable:
        data = dict(data)
        data["cells"] = [{t: Cell(**c) for t, c in row.items()} for row in data["cells"]]
        return cls(**data)


def non_finite(out: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> str | None:
    """The first output holding NaN/inf where the reference's same tensor holds none."""
    for name, value in out.items():
        arr = np.asarray(value)
        if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
            want = np.asarray(ref.get(name, np.zeros(1)))
            if want.dtype.kind not in "fc" or np.isfinite(want).all():
                return name
    return None


def row_bound(row: Mapping[str, Cell]) -> float | None:
    """EARLY_FACTOR times the fastest timing in ``row`` so far (None: nothing timed yet)."""
    timed = [c.ms for c in row.values() if c.ms is not None]
    return EARLY_FACTOR * min(timed) if timed else None


def exclusions(cells: list[dict[str, Cell]], whole: Mapping[str, Cell]) -> list[dict[str, Any]]:
    """Every (layer range, target) that could not run, with its one-line reason: consecutive
    layers failing on one target for one reason are one entry; the whole model is
    ``[0, n)``."""
    out: list[dict[str, Any]] = []
    for i, row in enumerate(cells):
        for target, cell in row.items():
            if cell.ms is not None:
                continue
            prev = next((e for e in out if e["target"] == target and e["layers"][1] == i
                         and e["reason"] == cell.reason), None)
            if prev is not None:
                prev["layers"][1] = i + 1
            else:
                out.append({"layers": [i, i + 1], "target": target, "reason": cell.reason})
    n = len(cells)
    wholes = [{"layers": [0, n], "target": t, "reason": c.reason}
              for t, c in whole.items() if c.ms is None and n > 1]
    # every layer failing for the reason the whole model did is that one entry, not two
    return out + [e for e in wholes if e not in out]
