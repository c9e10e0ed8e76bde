"""A whole model served on one thread or several, whichever runs faster now.

A plan of one onnxruntime CPU target whole is a choice between its multi-thread session
(``cpu``) and its one-thread sibling (``cpu-1t``): the same model, the same precision, only the
intra-op threads differ. Which one is faster moves with what the board does meanwhile, and by
more than planning can foresee: on a shared 2-vCPU machine the two-thread session ran 26%
faster than the one-thread one in one bench and 3% slower in the run before, with no other
process to be seen (the contention meter read 0). A plan timed in one of those windows then
lost to the other target for as long as it was served. So such a plan holds both sessions and
checks the choice live: every :data:`EXPLORE_EVERY`-th call runs on the other one, each
session's time is smoothed, and the faster beyond :data:`SWITCH_BELOW` serves. The cost is one
call in :data:`EXPLORE_EVERY` on the slower session, and the second session's memory.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from edgepilot.backends.base import Executable

# one call in this many runs on the session not serving, to keep its timing current
EXPLORE_EVERY = 32
# the other session serves once its smoothed time is under this share of the serving one's
SWITCH_BELOW = 0.95
ALPHA = 0.2  # weight of a new call's time in a session's smoothed time


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

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        # the other session's first timing on the second call: a plan installed in a window
        # that has passed is not served 30 calls on the slower one
        explore = self.calls == 2 or self.calls % EXPLORE_EVERY == 0
        k = 1 - self.serving if explore else self.serving
        t0 = time.perf_counter()
        out = self.arms[k].run(inputs)
        ms = (time.perf_counter() - t0) * 1e3
        prev = self.ewma[k]
        self.ewma[k] = ms if prev is None else ALPHA * ms + (1 - ALPHA) * prev
        mine, other = self.ewma[self.serving], self.ewma[1 - self.serving]
        if mine is not None and other is not None and other < SWITCH_BELOW * mine:
            self.serving = 1 - self.serving
            self.switches += 1
        return out

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
