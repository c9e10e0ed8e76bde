"""A llama.cpp worker process started ahead of need, so that loading a GGUF costs the load.

Starting a worker (``python -m edgepilot worker llamacpp ...``: the interpreter, edgepilot and
llama-cpp-python imported) took most of a model's load time: 0.89 s against llama-cpp-python's
own 0.18 s for SmolLM2-135M. A spare is that process with the imports done and no model: the
daemon starts one once it is ready (:meth:`SparePool.start`, ``[backends.llamacpp]
spare_worker``), the next load or worker restart is handed it (:meth:`SparePool.take`) and
sends it the model, and a new spare is started once that load is done (:meth:`SparePool.refill`,
not during it: its imports would take a core from the load).

A spare shows ``edgepilot worker llamacpp (spare) --fd N`` in ``ps`` and rewrites its command
line to the model's name when it is handed one. It leaves like any worker when the daemon closes
its connection or dies (the kernel closes a killed daemon's end: EOF), so it never outlives the
daemon.
"""

from __future__ import annotations

import logging
import threading

from edgepilot.backends.workers.exits import SPARE_PLACEHOLDER
from edgepilot.backends.workers.link import Spawned, spawn

log = logging.getLogger(__name__)


class SparePool:
    """At most one spare worker, kept while spares are wanted (after :meth:`start`, until
    :meth:`close`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: Spawned | None = None
        self._wanted = False

    @property
    def pid(self) -> int | None:
        """The spare's pid (None: there is none now)."""
        spare = self._spare
        return None if spare is None else spare.proc.pid

    def start(self) -> None:
        """Keep a spare from now on: start one unless one is there."""
        with self._lock:
            self._wanted = True
            self._fill()

    def _fill(self) -> None:
        if self._spare is not None and self._spare.alive():
            return
        try:
            self._spare = spawn("llamacpp", SPARE_PLACEHOLDER)
        except OSError as exc:  # no spare: loads start their own worker, as before
            log.warning("no spare llama.cpp worker (%s)", exc)
            self._spare = None

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether a spare is there with its imports done (it said hello), waiting up to
        ``timeout_s`` for it."""
        spare = self._spare
        try:
            return spare is not None and spare.conn.poll(timeout_s)
        except OSError:
            return False

    def take(self) -> Spawned | None:
        """The spare for a load to open its model in, if a live one is there."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and not spare.alive():
            spare.discard()
            return None
        return spare

    def refill(self) -> None:
        """A new spare after a load took the last (when spares are wanted)."""
        with self._lock:
            if self._wanted:
                self._fill()

    def close(self) -> None:
        """No more spares: the one there leaves (its connection closed: EOF)."""
        with self._lock:
            self._wanted = False
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.discard()
