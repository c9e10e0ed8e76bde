"""The board's power as the telemetry sampler read it: integrated into energy, and kept as a
curve over the recent past so that one request's energy can be read off it.

The sampler appends every sample here; the :class:`~edgepilot.telemetry.work.WorkMeter` reads
the curve over a request's wall time when the request ends. Both are handed this one object
by the composition root, so neither needs the other.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from itertools import pairwise

from edgepilot.telemetry.apportion import PowerSample
from edgepilot.telemetry.energy import EnergyIntegrator

# power samples kept for apportioning: a window of up to 3600 s at 10 Hz, plus slack
MAX_POWER_SAMPLES = 40_000


def _time(sample: PowerSample) -> float:
    return sample[0]


def power_points(samples: Sequence[PowerSample], start: float,
                 end: float) -> list[PowerSample] | None:
    """The power curve over [start, end] as apportion() points: the power at ``start``, every
    sample strictly inside, and the power at ``end``. Between two samples power is linear (the
    integrator's trapezoids); after the last sample it is held at that sample's value, because
    a request usually ends before the next sample is taken and must be answered now. Before
    the first sample kept, and next to an unreadable sample, it is unknown (None). Returns None
    when no stretch of [start, end] has a known power."""
    if not samples:
        return None

    def at(t: float) -> float | None:
        i = bisect_right(samples, t, key=_time)
        if i == 0:
            return None
        t0, p0 = samples[i - 1]
        if t == t0 or i == len(samples) or p0 is None:
            return p0
        t1, p1 = samples[i]
        if p1 is None:
            return None
        return p0 + (p1 - p0) * (t - t0) / (t1 - t0)

    inside = samples[bisect_right(samples, start, key=_time):bisect_right(samples, end, key=_time)]
    points = [(start, at(start)), *((t, p) for t, p in inside if t < end), (end, at(end))]
    known = any(a[1] is not None and b[1] is not None for a, b in pairwise(points))
    return points if known else None


class PowerHistory:
    """Energy since start and the recent power samples (appended on the loop, read from
    worker threads: a deque's append and a list() copy of it are each atomic)."""

    def __init__(self) -> None:
        self.energy = EnergyIntegrator()
        self.samples: deque[PowerSample] = deque(maxlen=MAX_POWER_SAMPLES)

    @property
    def started(self) -> bool:
        """True once a power sample was seen: without a sensor, energies are unknown."""
        return self.energy.started

    def add(self, t: float, power_w: float | None) -> None:
        """The board drew ``power_w`` (None: unreadable) at monotonic ``t``."""
        self.energy.add(t, power_w)
        if not self.samples or t > self.samples[-1][0]:  # the integrator ignores the others too
            self.samples.append((t, power_w))

    def curve(self, start: float, end: float) -> list[PowerSample] | None:
        """:func:`power_points` over [start, end] of the samples kept; None when unknown."""
        if not self.started:
            return None
        return power_points(list(self.samples), start, end)

    def since(self, t: float | None) -> list[PowerSample]:
        """The samples from monotonic ``t`` on (all of them when None)."""
        return [s for s in self.samples if t is None or s[0] >= t]

    def forget_before(self, t: float) -> None:
        """Drop samples no window or request still reaching back to ``t`` needs (the last
        one at or before ``t`` stays: the curve starts from it)."""
        while len(self.samples) > 1 and self.samples[1][0] <= t:
            self.samples.popleft()
