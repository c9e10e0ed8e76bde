"""Segment calibration: what a compiled segment really costs against the sum of its layers.

A segment compiled as one graph is not the sum of its layers timed alone: the runtime fuses
across layer boundaries, keeps activations in cache and pays its per-call cost once. Every
segment timed end to end (each target's whole model while profiling, every plan's segments
right after compiling) is kept as an :class:`Observation` of ``measured / predicted``, where
``predicted`` is the uncalibrated layer sum. A new plan is predicted with the median ratio of
the observations made *before* it; its own measurement is added only afterwards, so a reported
predicted/measured pair never shares a measurement.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

# the most recent observations per target that the ratio is taken over (clocks and load move)
KEEP = 9
# a ratio outside this range is a broken measurement, not a calibration
RATIO_BOUNDS = (0.2, 5.0)


@dataclass(frozen=True)
class Observation:
    """Segment ``[start, end)`` on ``target``: uncalibrated prediction and measured ms."""

    target: str
    start: int
    end: int
    predicted_ms: float
    measured_ms: float
    # "profile" (whole model per target), "segment" (a planned segment timed alone before
    # its plan is predicted) or "plan" (a plan's check after compiling)
    source: str = "plan"

    @property
    def ratio(self) -> float:
        return self.measured_ms / self.predicted_ms


@dataclass
class Calibration:
    """Per-target segment correction fitted on end-to-end segment measurements."""

    observations: list[Observation]

    def add(self, obs: Observation) -> None:
        lo, hi = RATIO_BOUNDS
        if obs.predicted_ms > 0 and obs.measured_ms > 0 and lo <= obs.ratio <= hi:
            self.observations.append(obs)

    def has(self, target: str, start: int, end: int) -> bool:
        """Whether segment ``[start, end)`` on ``target`` was ever timed end to end."""
        return any(o.target == target and (o.start, o.end) == (start, end)
                   for o in self.observations)

    def factor(self, target: str, start: int, end: int, n_layers: int) -> float:
        """measured/predicted to expect for segment ``[start, end)`` on ``target``.

        The same range measured before predicts itself best (the whole model on one target is
        timed while profiling). Other partial segments use the target's partial-segment
        observations; a whole model's ratio is never applied to a part of it (on cnn_head the
        int4 whole model ran 1.8x its layer sum, its conv half 1.0x). No data: 1.0.
        """
        mine = [o for o in self.observations if o.target == target]
        same = [o.ratio for o in mine if (o.start, o.end) == (start, end)][-KEEP:]
        if same:
            return statistics.median(same)
        if (start, end) == (0, n_layers):
            return 1.0
        part = [o.ratio for o in mine if (o.start, o.end) != (0, n_layers)][-KEEP:]
        return statistics.median(part) if part else 1.0

    def summary(self, segments: list[tuple[str, int, int]], n_layers: int
                ) -> list[dict[str, Any]]:
        """The factor applied to each of ``segments`` and how many observations it rests on."""
        out = []
        for target, s, e in segments:
            n = len([o for o in self.observations if o.target == target])
            out.append({"target": target, "layers": [s, e],
                        "factor": round(self.factor(target, s, e, n_layers), 4),
                        "observations": n})
        return out

    def as_list(self) -> list[dict[str, Any]]:
        return [asdict(o) for o in self.observations[-4 * KEEP:]]

    @classmethod
    def from_list(cls, items: list[dict[str, Any]] | None) -> Calibration:
        cal = cls([])
        for item in items or []:
            cal.add(Observation(**item))
        return cal

