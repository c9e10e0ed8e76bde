"""Bringing an excluded target back into plans.

A target that faulted (a crashed worker process, a runtime error) is left out of a model's
plans at once. It is tried again after a delay, doubling while it keeps failing (5 s up to
5 min): the model is replanned with the target allowed, and the new plan is checked on the
calibration inputs before it is installed — that run is the target's probe. A probe that fails
leaves the target out and schedules the next one; one that passes brings it back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)
FIRST_S = 5.0
MAX_S = 300.0


class Recovery:
    """Timers that retry excluded targets: ``readmit(target) -> bool`` is the probe."""

    def __init__(self, readmit: Callable[[str], bool], first_s: float = FIRST_S,
                 max_s: float = MAX_S) -> None:
        self.readmit = readmit
        self.first_s, self.max_s = first_s, max_s
        self._timers: dict[str, threading.Timer] = {}
        self._lock = threading.Lock()
        self.closed = False

    def watch(self, target: str, delay_s: float | None = None) -> None:
        """Try ``target`` again after ``delay_s`` (the first delay when None); once per target."""
        delay = self.first_s if delay_s is None else delay_s
        with self._lock:
            if self.closed or target in self._timers:
                return
            timer = threading.Timer(delay, self._try, (target, delay))
            timer.daemon = True
            timer.name = f"recover-{target}"
            self._timers[target] = timer
            timer.start()

    def pending(self) -> list[str]:
        with self._lock:
            return sorted(self._timers)

    def _try(self, target: str, delay: float) -> None:
        with self._lock:
            self._timers.pop(target, None)
            if self.closed:
                return
        try:
            ok = self.readmit(target)
        except Exception:
            log.exception("probe of %s failed unexpectedly", target)
            ok = False
        if not ok:
            self.watch(target, min(delay * 2, self.max_s))

    def close(self) -> None:
        """No more probes (the model is dropped or the daemon stops)."""
        with self._lock:
            self.closed = True
            timers, self._timers = list(self._timers.values()), {}
        for timer in timers:
            timer.cancel()
