"""Split a window's energy between the models that were busy in it.

Power is known at the sample instants and taken as linear in between (the trapezoid rule of
:class:`~edgepilot.telemetry.energy.EnergyIntegrator`, so the parts add up to the same window
energy). The window is cut at every request start and end; each piece's energy goes to the
requests running during it, shared equally between them (two concurrent requests of one model
give that model two shares), and a piece with no request running is idle energy, attributed to
no model. A model's energy over the window is therefore its busy time weighted by the power the
board drew while it ran. Between samples whose power is unknown nothing is integrated, as in the
integrator.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

PowerSample = tuple[float, float | None]  # (monotonic s, W or None when unreadable)
Interval = tuple[float, float]  # (start, end) monotonic s


@dataclass
class Apportioned:
    """Energy (J) of one window: per model, idle (no request running), and their total."""

    models_j: dict[str, float] = field(default_factory=dict)
    idle_j: float = 0.0
    total_j: float = 0.0


def apportion(samples: Sequence[PowerSample],
              busy: Mapping[str, Sequence[Interval]]) -> Apportioned:
    """Apportion the energy integrated over ``samples`` (sorted by time) by ``busy`` intervals.

    Every model in ``busy`` appears in the result, with 0.0 when none of its time fell where
    power was known.
    """
    out = Apportioned(models_j={m: 0.0 for m in busy})
    events = sorted((t, delta, model) for model, ivs in busy.items() for start, end in ivs
                    if end > start for t, delta in ((start, 1), (end, -1)))
    active: Counter[str] = Counter()
    i = 0

    def apply_until(t: float, inclusive: bool) -> None:
        nonlocal i
        while i < len(events) and (events[i][0] < t or (inclusive and events[i][0] == t)):
            _, delta, model = events[i]
            active[model] += delta
            if active[model] <= 0:
                del active[model]
            i += 1

    def share(energy: float) -> None:
        out.total_j += energy
        running = sum(active.values())
        if running == 0:
            out.idle_j += energy
            return
        for model, n in active.items():
            out.models_j[model] += energy * n / running

    for (t0, p0), (t1, p1) in pairwise(samples):
        apply_until(t0, inclusive=True)
        if p0 is None or p1 is None or t1 <= t0:
            continue

        def power(t: float, t0: float = t0, p0: float = p0, t1: float = t1,
                  p1: float = p1) -> float:
            return p0 + (p1 - p0) * (t - t0) / (t1 - t0)

        a = t0
        while i < len(events) and events[i][0] < t1:
            c = events[i][0]
            share((power(a) + power(c)) * 0.5 * (c - a))
            apply_until(c, inclusive=True)
            a = c
        share((power(a) + p1) * 0.5 * (t1 - a))
    return out
