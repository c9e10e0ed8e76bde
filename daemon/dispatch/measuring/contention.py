"""How much of the machine other work took while something was timed.

A timing taken while other processes ran (a build, a second model's requests, a neighbour
virtual machine's steal) is slower than the same work on a quiet board, and unevenly so: a
two-thread session loses its second core and reads 1.5x its quiet time where a one-thread
session of the same model hardly moves. A choice between such close targets made in that
window is served on the quiet board after it. So the windows that decide a plan are metered:
the share of the machine's CPU capacity that went to anything but this process and its children
(the kernel's counters of every CPU, the hypervisor's steal included, less this process's own
CPU time and its workers') over the window's wall time. Planning re-times a contended
comparison and does not keep its verdict for later plans (see ``planning/versus.py``);
``bench`` reports the figure next to its ratios.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import psutil

# other work above this share of the machine's CPUs makes a window's timing suspect: one busy
# core of two (0.5) slowed a two-thread session by 1.5x here; a quarter is a core half busy
CONTENDED = 0.25


def _busy_s() -> float:
    """CPU seconds every CPU of the machine spent on anything (steal counted as taken)."""
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq",
                                            "steal"))


def _own_s(proc: psutil.Process) -> float:
    """This process's CPU seconds and its children's (a backend's worker process runs the
    timed work itself; a reaped child's time moves into ``children_*``)."""
    t = proc.cpu_times()
    own = t.user + t.system + t.children_user + t.children_system
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.Error:  # gone meanwhile: its time is in children_* once reaped
            continue
        own += c.user + c.system
    return float(own)


@dataclass
class OtherLoad:
    """A meter started at construction: :meth:`share` is the fraction (0..1) of the machine's
    CPU capacity that other work took since then."""

    _proc: psutil.Process = field(default_factory=psutil.Process, repr=False)
    _cpus: int = field(default_factory=lambda: psutil.cpu_count() or 1)
    _t0: float = 0.0
    _busy0: float = 0.0
    _own0: float = 0.0

    def __post_init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """Start a new window now."""
        self._t0, self._busy0, self._own0 = time.monotonic(), _busy_s(), _own_s(self._proc)

    def share(self) -> float:
        """Other work's share of the CPUs since the window started (0.0 for a window too short
        for the kernel's counters, which tick every 10 ms)."""
        wall = time.monotonic() - self._t0
        if wall < 0.05:
            return 0.0
        others = (_busy_s() - self._busy0) - (_own_s(self._proc) - self._own0)
        return round(min(1.0, max(0.0, others / (wall * self._cpus))), 3)


class RecentLoad:
    """Other work's share of the CPUs over about the last second, cheap enough to keep per
    request: :meth:`tick` (every request) leaves a meter every half window, the last three
    kept; :meth:`share` reads from the oldest one between half a window and two windows old,
    or, where requests were too sparse to leave one, meters a quarter window now."""

    def __init__(self, window_s: float = 1.0) -> None:
        self.window_s = window_s
        self._marks: deque[OtherLoad] = deque(maxlen=3)

    def tick(self) -> None:
        if not self._marks or time.monotonic() - self._marks[-1]._t0 >= self.window_s / 2:
            self._marks.append(OtherLoad())

    def share(self) -> float:
        now = time.monotonic()
        for mark in self._marks:  # oldest first
            if self.window_s / 2 <= now - mark._t0 <= 2 * self.window_s:
                return mark.share()
        meter = OtherLoad()
        time.sleep(self.window_s / 4)
        return meter.share()
