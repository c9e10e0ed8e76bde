"""Watch a running plan: EWMA of each segment's latency against its prediction.

A segment whose smoothed latency departs from its prediction by more than ``drift_threshold``
(relative) and by more than :data:`MIN_DRIFT_MS` after ``min_samples`` requests reports drift;
the dispatcher then scales that target's costs by the observed ratio and replans.

The absolute floor is what serving adds to a call that profiling, timing a segment back to back
with warm caches, does not see: a request's thread hand-off and cold caches cost a fraction of a
millisecond, which is 3-15x a small model's prediction. Without it a 10 µs model (a tree
ensemble, a keyword spotter) read as drifted every third request, forever, each time replanning
in the request's path (150-340 ms), since no replan can remove that cost.

A replan is applied only when the new plan is predicted to beat the current one (re-costed the
same way) by more than ``hysteresis``, so noise does not make plans flap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# a departure under this is serving's own per-call cost, no target's slowing (see above)
MIN_DRIFT_MS = 1.0


@dataclass
class Monitor:
    drift_threshold: float = 0.5
    alpha: float = 0.3
    min_samples: int = 3
    predicted: list[float] = field(default_factory=list)
    ewma: list[float | None] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    # measured / predicted per segment when the plan was installed (see :meth:`install`)
    bias: list[float] = field(default_factory=list)

    def reset(self, predicted: list[float]) -> None:
        """Start watching a new plan whose segments are predicted to take ``predicted`` ms."""
        self.predicted = list(predicted)
        self.ewma = [None] * len(predicted)
        self.samples = [0] * len(predicted)

    def install(self, predicted: list[float], measured: list[float]) -> None:
        """Watch a newly installed plan from how it ran when installed (``measured`` ms per
        segment), and keep how far that was from ``predicted`` for :meth:`expect`.

        A prediction can miss a segment by more than the threshold from the start (a whole
        model a rival target won side by side runs at its own pace, not at its layers' sum):
        held as the baseline, that miss read as drift every third request and replanned in
        the request's path, back to the same plan. Drift is a departure from how it ran."""
        ok = len(measured) == len(predicted) and all(m > 0 for m in measured) \
            and all(p > 0 for p in predicted)
        self.bias = [m / p for m, p in zip(measured, predicted, strict=True)] if ok \
            else [1.0] * len(predicted)
        self.expect(predicted)

    def expect(self, predicted: list[float]) -> None:
        """The same plan re-predicted on new costs (new clocks, a drifted target's factor):
        watch for departures from those, as far off as the install found the predictions."""
        bias = self.bias if len(self.bias) == len(predicted) else [1.0] * len(predicted)
        self.reset([p * b for p, b in zip(predicted, bias, strict=True)])

    def observe(self, times_ms: list[float]) -> list[int]:
        """Record one request's per-segment times; return the segments now drifting."""
        drifted = []
        for k, ms in enumerate(times_ms[: len(self.predicted)]):
            prev = self.ewma[k]
            self.ewma[k] = ms if prev is None else self.alpha * ms + (1 - self.alpha) * prev
            self.samples[k] += 1
            ready = self.samples[k] >= self.min_samples
            if ready and abs(self.ratio(k) - 1) > self.drift_threshold \
                    and abs(self.ewma[k] - self.predicted[k]) > MIN_DRIFT_MS:  # type: ignore[operator]
                drifted.append(k)
        return drifted

    def ratio(self, k: int) -> float:
        """Observed / predicted for segment ``k`` (1.0 before the first sample)."""
        ew = self.ewma[k]
        pred = self.predicted[k]
        if ew is None or pred <= 0:
            return 1.0
        return ew / pred

    def snapshot(self) -> list[dict[str, float | None]]:
        return [{"predicted_ms": p, "ewma_ms": e, "samples": n}
                for p, e, n in zip(self.predicted, self.ewma, self.samples, strict=True)]


def worth_switching(current_ms: float, new_ms: float, hysteresis: float) -> bool:
    """Apply a new plan only if it is predicted faster by more than the hysteresis margin."""
    return new_ms < current_ms * (1 - hysteresis)
