"""Energy from power samples: trapezoidal integration over a monotonic clock."""

from __future__ import annotations


class EnergyIntegrator:
    """Integrates power (W) over monotonic time (s) into energy (J), trapezoid rule.

    A sample without power (sensor unreadable this time) breaks the chain: the next good sample
    starts a new segment instead of bridging a gap whose power is unknown; ``gap_s`` counts the
    time that was not integrated so a consumer can tell.
    """

    def __init__(self) -> None:
        self.energy_j = 0.0
        self.gap_s = 0.0
        self._last: tuple[float, float] | None = None
        self._last_t: float | None = None

    @property
    def started(self) -> bool:
        """True once at least one power sample was seen (so ``energy_j`` means something)."""
        return self._last is not None or self.energy_j > 0.0

    def add(self, t: float, power_w: float | None) -> float:
        """Add the sample taken at monotonic ``t``; return the energy added by it."""
        added = 0.0
        if self._last_t is not None and t <= self._last_t:
            # a clock that did not advance adds nothing; keep the earlier point
            return 0.0
        if power_w is None:
            if self._last_t is not None:
                self.gap_s += t - self._last_t
            self._last = None
        else:
            if self._last is not None:
                t0, p0 = self._last
                added = (p0 + power_w) * 0.5 * (t - t0)
                self.energy_j += added
            elif self._last_t is not None:
                self.gap_s += t - self._last_t
            self._last = (t, power_w)
        self._last_t = t
        return added
