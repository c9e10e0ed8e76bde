"""One life of a llama.cpp worker process, as the daemon sees it: the generic worker link
(:mod:`..workers.link`: the child, the connection, the requests in flight, how it died) plus what
llama.cpp adds — streamed answers, calls by method name, and the step guard: each decode step
the worker asks for runs while the daemon holds the device (see :mod:`.worker`).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import queue
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from edgepilot.backends.workers.exits import WorkerCrashed
from edgepilot.backends.workers.link import Spawned, WorkerLink
from edgepilot.errors import BackendError

log = logging.getLogger(__name__)
# a busy worker is hung after this many times its slowest decode step without one (at least
# [backends.llamacpp] hang_timeout_s); the watchdog looks every WATCH_S
HANG_FACTOR = 50.0
WATCH_S = 0.25
# the deadline of a worker none of whose steps was measured yet: a hang on the first request
# is still found, and a slow first step (weights paged in from an SD card) is not one
COLD_HANG_S = 120.0
# how long loading may take (a model on a slow SD card, a big GPU offload) before it is killed
LOAD_TIMEOUT_S = 600.0
StepGuard = Callable[[], AbstractContextManager[None]]
RUNTIME = "llama.cpp"  # as a crash names it: "SIGSEGV: a crash in llama.cpp"
__all__ = ["StepGuard", "WorkerCrashed", "WorkerProcess"]


class WorkerProcess(WorkerLink):
    """A started llama.cpp worker with the model loaded (the constructor waits for it), or an
    error: the generic link plus streamed answers and the per-step device guard."""

    def __init__(self, model: str, options: dict[str, Any], guard: Callable[[], StepGuard | None],
                 on_death: Callable[[WorkerProcess], None], spawned: Spawned | None = None
                 ) -> None:
        self._guard = guard
        # the hang watchdog: decode steps the worker reported, when they last grew, the
        # slowest step seen; 0 = off
        self.hang_min_s = float(options.get("settings", {}).get("hang_timeout_s", 0.0))
        self._progress = 0
        self._step_tokens = 1
        self._progress_at = time.monotonic()
        self.slowest_step_s = 0.0
        self._waiting_go = False
        # before the link starts its reader: a step may be asked for at once
        self._steps: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._step_done: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._guard_thread: threading.Thread | None = None
        super().__init__("llamacpp", model, options, on_death, runtime=RUNTIME,
                         load_timeout_s=LOAD_TIMEOUT_S, spawned=spawned)
        if self.hang_min_s > 0:
            threading.Thread(target=self._watch, name=f"llama-worker-{self.pid}-watchdog",
                             daemon=True).start()

    # ---- requests ------------------------------------------------------------------------------
    def request(self, method: str, kwargs: dict[str, Any]
                ) -> tuple[int, queue.SimpleQueue[tuple[Any, ...]]]:
        """Start ``method`` in the worker; its answers arrive on the returned queue."""
        answers: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        with self._lock:
            if self.fault is not None:
                raise self.fault
            rid = next(self._ids)
            self.pending[rid] = answers
        try:
            self.send(("call", rid, method, kwargs))
        except (TypeError, AttributeError, pickle.PicklingError) as exc:
            # pickling refused a parameter (a callable such as a logits processor)
            self.forget(rid)
            raise BackendError(
                f"a {method} parameter cannot be sent to the model's worker process ({exc}); "
                "only plain data crosses it — or set [backends.llamacpp] isolation = "
                "'thread'", field="params") from None
        except BaseException:
            self.forget(rid)
            raise
        return rid, answers

    def forget(self, rid: int) -> None:
        with self._lock:
            self.pending.pop(rid, None)

    def call_method(self, method: str, **kwargs: Any) -> Any:
        """``method`` in the worker, waited for: its value, or its error raised here."""
        rid, answers = self.request(method, kwargs)
        try:
            msg = answers.get()
        finally:
            self.forget(rid)
        if msg[0] == "result":
            return msg[1]
        raise msg[1]

    # ---- the reader's own messages -------------------------------------------------------------
    def _route(self, msg: tuple[Any, ...]) -> None:
        if msg[0] == "beat":
            self._beat(int(msg[1]), int(msg[2]), float(msg[3]) if len(msg) > 3 else 0.0)
        elif msg[0] == "step":
            self._start_guard()
            self._steps.put(msg[1])
        elif msg[0] == "step_done":
            self._step_done.put(msg[1])
        else:
            super()._route(msg)

    # ---- hang watchdog -------------------------------------------------------------------------
    def _beat(self, tokens: int, step_tokens: int, measured_s: float) -> None:
        now = time.monotonic()
        self._step_tokens = max(1, step_tokens)
        # the worker's own timing of its steps: it arms the watchdog even when every request
        # so far ended between two beats (short answers on a quiet machine)
        self.slowest_step_s = max(self.slowest_step_s, measured_s)
        if tokens != self._progress:
            if self.busy():
                per_token = (now - self._progress_at) / max(1, tokens - self._progress)
                self.slowest_step_s = max(self.slowest_step_s, per_token)
            self._progress, self._progress_at = tokens, now

    def busy(self) -> bool:
        """Requests in flight that the worker itself must answer (not waiting for the
        daemon's step guard)."""
        with self._lock:
            return bool(self.pending) and not self._waiting_go

    def deadline_s(self) -> float:
        """How long a busy worker may go without a decode step: HANG_FACTOR times the slowest
        time per token it was seen take, times the tokens of the decode under way (a prompt
        chunk reads many), at least ``hang_timeout_s``; before any step was measured (weights
        paged in from disk, a cold start under load), at least COLD_HANG_S."""
        if self.slowest_step_s == 0:
            return max(self.hang_min_s, COLD_HANG_S)
        return max(self.hang_min_s, HANG_FACTOR * self.slowest_step_s * self._step_tokens)

    def _watch(self) -> None:
        while not self.dead.wait(WATCH_S):
            now = time.monotonic()
            if not self.busy():
                self._progress_at = now  # idle time is no silence
                continue
            silent = now - self._progress_at
            deadline = self.deadline_s()
            if silent > deadline and not self.closing:
                self.hung = (f"no decode step for {silent:.1f} s with {len(self.pending)} "
                             f"request(s) in flight; deadline {deadline:.1f} s = the larger of "
                             f"{HANG_FACTOR:.0f} x its slowest time per token "
                             f"({self.slowest_step_s * 1e3:.0f} ms) x {self._step_tokens} "
                             "token(s) under way and hang_timeout_s")
                log.error("llama.cpp worker %d for %s hung: %s; killing it", self.pid,
                          self.model, self.hung)
                self.proc.kill()
                return

    def _after_death(self) -> None:
        self._steps.put(None)
        self._step_done.put(None)

    # ---- step guard ----------------------------------------------------------------------------
    def _start_guard(self) -> None:
        if self._guard_thread is None:
            self._guard_thread = threading.Thread(target=self._hold_steps, daemon=True,
                                                  name=f"llama-worker-{self.pid}-steps")
            self._guard_thread.start()

    def _hold_steps(self) -> None:
        """Each decode step the worker asks for runs while this thread holds the parent's step
        guard (the serving layer's device): take it, say go, give it back when the worker says
        the step is done (or dies)."""
        while True:
            token = self._steps.get()
            if token is None:
                return
            factory = self._guard()
            self._waiting_go = True  # the device may be held a while: not the worker's silence
            with factory() if factory is not None else contextlib.nullcontext():
                self._waiting_go = False
                self._progress_at = time.monotonic()
                try:
                    self.send(("step_go", token))
                except WorkerCrashed:
                    return
                if self._step_done.get() is None:
                    return
