"""A whole model served on one thread or several, whichever runs faster now.

A plan of one onnxruntime CPU target whole is a choice between its multi-thread session
(``cpu``) and its one-thread sibling (``cpu-1t``): the same model, the same precision, only the
intra-op threads differ. Which one is faster moves with what the board does meanwhile, and by
more than planning can foresee: on a shared 2-vCPU machine the two-thread session ran 26%
faster than the one-thread one in one bench and 3% slower in the run before, with no other
process to be seen (the contention meter read 0). A plan timed in one of those windows then
lost to the other target for as long as it was served. So such a plan holds both sessions and
checks the choice live: now and then the other one takes two calls (the first wakes it, the
second is timed; no more than :data:`EXPLORE_SHARE` of the time), each session's time is
smoothed, and the faster beyond :data:`SWITCH_BELOW` serves. The cost is that share of the
time on the slower session, and the second session's memory.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from edgepilot.backends.base import Executable

# the fewest calls between two turns of the session not serving
EXPLORE_EVERY = 32
# and at most this share of the time spent on it: a turn is two calls there (the first wakes
# its thread pool and brings its weights back into cache, the second is timed), so a session
# twice as slow is visited every 2 * 2 / 0.01 = 400 calls. Visited every 32nd call, untimed
# call first or not, a 0.1 ms model's two-thread session (cold: 10x its one-thread time) cost
# the one-thread plan 26%
EXPLORE_SHARE = 0.01
# the other session serves once its time is under this share of the serving one's
SWITCH_BELOW = 0.95
ALPHA = 0.3  # weight of a new timing in a session's smoothed time


class ThreadRace(Executable):
    """Two executables of one model and precision that differ in their threads; ``arms[0]``
    is the planned target's and serves first."""

    def __init__(self, arms: list[Executable]) -> None:
        self.arms = arms
        self.target = arms[0].target
        self.inputs, self.outputs = arms[0].inputs, arms[0].outputs
        self.serving = 0
        self.calls = 0
        self.switches = 0
        self.ewma: list[float | None] = [None] * len(arms)
        self._turn = 0       # calls left in the other session's turn (2: warm, then timed)
        self._last_turn = 0  # the call the last turn began at

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        # the first turn on the second call (a plan installed in a window that has passed is
        # not served long on the slower one), then spaced by what both take now
        if self._turn == 0 and (self.calls == 2
                                or self.calls - self._last_turn >= self._spacing()):
            self._turn, self._last_turn = 2, self.calls
        k = 1 - self.serving if self._turn else self.serving
        t0 = time.perf_counter()
        out = self.arms[k].run(inputs)
        ms = (time.perf_counter() - t0) * 1e3
        if self._turn:
            self._turn -= 1
            if self._turn:  # the untimed call that wakes it
                return out
        prev = self.ewma[k]
        self.ewma[k] = ms if prev is None else ALPHA * ms + (1 - ALPHA) * prev
        mine, other = self.ewma[self.serving], self.ewma[1 - self.serving]
        if mine is not None and other is not None and other < SWITCH_BELOW * mine:
            self.serving = 1 - self.serving
            self.switches += 1
        return out

    def _spacing(self) -> int:
        """Calls until the next turn: two calls of the other session are at most
        :data:`EXPLORE_SHARE` of the time, and at least :data:`EXPLORE_EVERY` calls apart."""
        mine, other = self.ewma[self.serving], self.ewma[1 - self.serving]
        if not mine or not other:
            return EXPLORE_EVERY
        return max(EXPLORE_EVERY, int(2 * other / (mine * EXPLORE_SHARE)))

    @property
    def serving_target(self) -> str:
        """The target whose session serves now."""
        return str(self.arms[self.serving].target)

    def describe(self) -> dict[str, Any]:
        """What the race found (for the plan's explanation)."""
        return {"targets": [str(a.target) for a in self.arms], "serving": self.serving_target,
                "ms": [None if e is None else round(e, 4) for e in self.ewma],
                "calls": self.calls, "switches": self.switches}

    @property
    def memory_bytes(self) -> int:
        return sum(a.memory_bytes for a in self.arms)

    def reset_state(self) -> None:
        for a in self.arms:
            a.reset_state()

    def close(self) -> None:
        for a in self.arms:
            a.close()
