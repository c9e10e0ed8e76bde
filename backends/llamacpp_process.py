"""One life of a llama.cpp worker process, as the daemon sees it: the child, the connection,
the requests in flight on it, and how it died.

A reader thread routes the worker's messages (see :mod:`.llamacpp_worker` for the protocol) to
each request's queue. When the connection breaks, the process is reaped and every request still
in flight gets a :class:`WorkerCrashed` naming how it ended (the signal, or the exit status).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import pickle
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from multiprocessing.connection import Connection
from typing import Any

from edgepilot.backends.worker_exit import (
    WorkerCrashed,
    how_it_ended,
    rebuild_error,
    worker_argv,
)
from edgepilot.errors import BackendError

log = logging.getLogger(__name__)
# how long a worker may take to leave after it is asked to close, before it is killed
CLOSE_TIMEOUT_S = 10.0
# how long loading may take (a model on a slow SD card, a big GPU offload) before it is killed
LOAD_TIMEOUT_S = 600.0
StepGuard = Callable[[], AbstractContextManager[None]]
RUNTIME = "llama.cpp"  # as a crash names it: "SIGSEGV: a crash in llama.cpp"
__all__ = ["StepGuard", "WorkerCrashed", "WorkerProcess"]


class WorkerProcess:
    """A started worker with the model loaded (the constructor waits for it), or an error."""

    def __init__(self, model: str, options: dict[str, Any], guard: Callable[[], StepGuard | None],
                 on_death: Callable[[WorkerProcess], None]) -> None:
        self.model = model
        self._guard = guard
        self._on_death = on_death
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.pending: dict[int, queue.SimpleQueue[tuple[Any, ...]]] = {}
        self.fault: WorkerCrashed | None = None
        self.returncode: int | None = None
        self.in_flight_lost = 0
        self.closing = False
        self.started = time.monotonic()
        self.dead = threading.Event()
        self._steps: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._step_done: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._guard_thread: threading.Thread | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(worker_argv("llamacpp", model, theirs.fileno()),
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self.conn = Connection(ours.detach())
        try:
            self.conn.send(("open", options))
            if not self.conn.poll(LOAD_TIMEOUT_S):
                log.error("llama.cpp worker %d did not load %s in %.0f s; killing it",
                          self.pid, model, LOAD_TIMEOUT_S)
                self.proc.kill()
            reply = self.conn.recv()
        except (EOFError, OSError):
            rc = self._reap()
            raise WorkerCrashed(f"the llama.cpp worker for {model!r} (pid {self.pid}) "
                                f"{how_it_ended(rc, RUNTIME)} while loading the model; see the "
                                "log above", field="model") from None
        if reply[0] != "ready":
            self._reap()
            raise rebuild_error(reply[1])
        self.facts: dict[str, Any] = reply[1]
        threading.Thread(target=self._read, name=f"llama-worker-{self.pid}",
                         daemon=True).start()

    # ---- requests ------------------------------------------------------------------------------
    def send(self, msg: tuple[Any, ...]) -> None:
        """Send one message; a worker already gone is a :class:`WorkerCrashed`."""
        try:
            with self._send_lock:
                self.conn.send(msg)
        except (OSError, ValueError):
            self.dead.wait(CLOSE_TIMEOUT_S)  # the reader names the fault
            raise self.fault or WorkerCrashed(
                f"the llama.cpp worker for {self.model!r} (pid {self.pid}) is gone",
                field="model") from None

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

    def call(self, method: str, **kwargs: Any) -> Any:
        """``method`` in the worker, waited for: its value, or its error raised here."""
        rid, answers = self.request(method, kwargs)
        try:
            msg = answers.get()
        finally:
            self.forget(rid)
        if msg[0] == "result":
            return msg[1]
        raise msg[1]

    # ---- the reader ----------------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # a message we cannot read: the worker is no longer trusted
                log.exception("unreadable message from llama.cpp worker %d", self.pid)
                self.proc.kill()
                break
            kind = msg[0]
            if kind == "step":
                self._start_guard()
                self._steps.put(msg[1])
            elif kind == "step_done":
                self._step_done.put(msg[1])
            else:
                with self._lock:
                    answers = self.pending.get(msg[1])
                if answers is None:
                    continue  # a request given up on (its caller left)
                if kind == "error":
                    answers.put(("error", rebuild_error(msg[2])))
                else:
                    answers.put(msg[:1] + msg[2:])
        rc = self._reap()
        self.fault = WorkerCrashed(
            f"the llama.cpp worker for model {self.model!r} (pid {self.pid}) "
            f"{how_it_ended(rc, RUNTIME)}"
            "; the request on it is lost and the worker is restarted — retry (the daemon log "
            "holds the worker's last words)", field="model")
        self.returncode = rc
        with self._lock:
            lost = list(self.pending.values())
            self.pending.clear()
        self.in_flight_lost = len(lost)
        try:
            if not self.closing:
                # the fault is told first (backend.fault), then the requests: whoever they
                # tell finds the event already out
                self._on_death(self)
        finally:
            for answers in lost:
                answers.put(("error", self.fault))
            self._steps.put(None)
            self._step_done.put(None)
            self.dead.set()

    def _reap(self) -> int | None:
        with contextlib.suppress(OSError):
            self.conn.close()
        try:
            return self.proc.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # the connection broke but it lives: end it
            self.proc.kill()
            return self.proc.wait()

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
            with factory() if factory is not None else contextlib.nullcontext():
                try:
                    self.send(("step_go", token))
                except WorkerCrashed:
                    return
                if self._step_done.get() is None:
                    return

    # ---- the end -------------------------------------------------------------------------------
    def close(self) -> None:
        """Ask the worker to close the model and leave; killed if it does not in time."""
        self.closing = True
        with contextlib.suppress(WorkerCrashed):
            self.send(("close",))
        if not self.dead.wait(CLOSE_TIMEOUT_S):
            log.warning("llama.cpp worker %d did not leave in %.0f s; killing it", self.pid,
                        CLOSE_TIMEOUT_S)
            self.proc.kill()
            self.dead.wait(CLOSE_TIMEOUT_S)
