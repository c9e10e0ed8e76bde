"""Board power over one bounded measurement (a benchmark, one profile of a sweep).

The daemon's :class:`~edgepilot.telemetry.sampler.TelemetrySampler` reads the board on its own
interval for as long as the daemon runs; a measurement that runs without the daemon (``edgepilot
sweep``) or must not depend on its interval (the SLO picker) samples here instead, on a thread,
for exactly the time it is entered.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Protocol

from edgepilot.telemetry.energy import EnergyIntegrator

SAMPLE_PERIOD_S = 0.1


class _PowerSampleLike(Protocol):
    power_w: float | None


class PowerBoard(Protocol):
    """What is read: ``edgepilot.board.Board`` (or a test's fake tree behind it)."""

    def sample(self) -> _PowerSampleLike: ...


class PowerSampler:
    """Board power sampled every :data:`SAMPLE_PERIOD_S` while the ``with`` block runs.

    ``mean_w`` is the mean of the readable samples (None when the board has no power sensor);
    ``energy`` integrates the same samples over time, a gap where power was unreadable left out.
    """

    def __init__(self, board: PowerBoard, period_s: float = SAMPLE_PERIOD_S) -> None:
        self.board = board
        self.period_s = period_s
        self.samples: list[float] = []
        self.energy = EnergyIntegrator()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="power-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            watts = self.board.sample().power_w
            self.energy.add(time.monotonic(), None if watts is None else float(watts))
            if watts is not None:
                self.samples.append(float(watts))
            self._stop.wait(self.period_s)

    def __enter__(self) -> PowerSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def mean_w(self) -> float | None:
        """Mean board power (W) over the block, None without a readable sensor."""
        return statistics.fmean(self.samples) if self.samples else None
