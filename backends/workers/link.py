"""One life of a worker process as the daemon sees it, for any runtime: the child, the
connection, the requests in flight on it, and how it died.

The generic half of :mod:`..llamacpp.process` (which keeps its own class for llama.cpp's step
guard and streaming; it could adopt this one): the worker is started as
``python -m edgepilot worker <backend> <model> --fd N`` on one end of a unix socket pair, sent
``("open", options)`` and answers ``("ready", facts)`` or ``("failed", error)``. Then each
request is ``(kind, rid, *args)`` and is answered by ``("result", rid, value)`` or
``("error", rid, error)``; a reader thread routes answers by ``rid``. When the connection
breaks the process is reaped and every request still in flight gets a
:class:`~.exits.WorkerCrashed` naming how it ended (the signal, or the status).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from edgepilot.backends.workers.exits import (
    WorkerCrashed,
    error_data,
    how_it_ended,
    rebuild_error,
    worker_argv,
)

log = logging.getLogger(__name__)
# how long a worker may take to leave after it is asked to close, before it is killed
CLOSE_TIMEOUT_S = 10.0
__all__ = ["Spawned", "WorkerCrashed", "WorkerLink", "error_data", "how_it_ended", "spawn"]


@dataclass
class Spawned:
    """A started worker process and the daemon's end of its connection, not yet told what to
    load (a spare, or the one a link is about to open)."""

    proc: subprocess.Popen[bytes]
    conn: Connection
    started: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def discard(self) -> None:
        """End it: the closed connection is its EOF (it leaves); killed if it lingers."""
        with contextlib.suppress(OSError):
            self.conn.close()
        try:
            self.proc.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def spawn(backend: str, model: str) -> Spawned:
    """Start ``python -m edgepilot worker <backend> <model> --fd N`` on one end of a unix
    socket pair."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc = subprocess.Popen(worker_argv(backend, model, theirs.fileno()),
                                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return Spawned(proc, Connection(ours.detach()))


class WorkerLink:
    """A started worker that answered ``ready`` (the constructor waits), or an error.

    ``on_death(link)`` is called on the reader thread when the worker dies unasked (not after
    :meth:`close`)."""

    def __init__(self, backend: str, model: str, options: dict[str, Any],
                 on_death: Callable[[Any], None], *, runtime: str | None = None,
                 load_timeout_s: float | None = None, spawned: Spawned | None = None) -> None:
        """``spawned``: a worker process started ahead (a spare) to open the model in; None:
        one is started here."""
        self.backend, self.model = backend, model
        # how messages name it ("the llama.cpp worker", "a crash in llama.cpp")
        self.label = runtime or backend
        self._runtime = runtime or "the runtime"
        self._on_death = on_death
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.pending: dict[int, queue.SimpleQueue[tuple[Any, ...]]] = {}
        self.fault: WorkerCrashed | None = None
        self.returncode: int | None = None
        self.in_flight_lost = 0
        self.closing = False
        # set (why) before a hung worker is killed: the fault then names the hang, not SIGKILL
        self.hung: str | None = None
        self.started = time.monotonic()
        self.dead = threading.Event()
        # how long this load waited for the process to be up with its runtime imported (0: a
        # spare that was ready); None: the worker does not say (it sends no "hello")
        self.start_wait_s: float | None = None
        spawned = spawned or spawn(backend, model)
        self.proc, self.conn, self.pid = spawned.proc, spawned.conn, spawned.proc.pid
        try:
            self.conn.send(("open", options))
            reply = self._recv(load_timeout_s)
            if reply[0] == "hello":  # the runtime is imported; the load starts now
                self.start_wait_s = time.monotonic() - self.started
                reply = self._recv(load_timeout_s)
        except (EOFError, OSError):
            rc = self._reap()
            raise WorkerCrashed(f"the {self.label} worker for {model!r} (pid {self.pid}) "
                                f"{how_it_ended(rc, self._runtime)} while loading the model; "
                                "see the log above", field="model") from None
        if reply[0] != "ready":
            self._reap()
            raise rebuild_error(reply[1])
        self.facts: dict[str, Any] = reply[1]
        threading.Thread(target=self._read, name=f"{backend}-worker-{self.pid}",
                         daemon=True).start()

    def _recv(self, timeout_s: float | None) -> Any:
        if timeout_s is not None and not self.conn.poll(timeout_s):
            log.error("%s worker %d did not load %s in %.0f s; killing it", self.label,
                      self.pid, self.model, timeout_s)
            self.proc.kill()
        return self.conn.recv()

    # ---- hooks for a runtime's own messages (the llama.cpp worker's step guard) -----------------
    def _route(self, msg: tuple[Any, ...]) -> None:
        """Hand an answer ``(kind, rid, *rest)`` to its request as ``(kind, *rest)``."""
        with self._lock:
            answers = self.pending.get(msg[1])
        if answers is None:
            return  # a request given up on (its caller left)
        if msg[0] == "error":
            answers.put(("error", rebuild_error(msg[2])))
        else:
            answers.put(msg[:1] + msg[2:])

    def _after_death(self) -> None:
        """Called once the worker is gone and its requests were answered."""

    @property
    def alive(self) -> bool:
        return self.fault is None

    def send(self, msg: tuple[Any, ...]) -> None:
        """Send one message; a worker already gone is a :class:`WorkerCrashed`."""
        try:
            with self._send_lock:
                self.conn.send(msg)
        except (OSError, ValueError):
            self.dead.wait(CLOSE_TIMEOUT_S)  # the reader names the fault
            raise self.fault or WorkerCrashed(
                f"the {self.label} worker for {self.model!r} (pid {self.pid}) is gone",
                field="model") from None

    def call(self, kind: str, *args: Any) -> Any:
        """Send ``(kind, rid, *args)`` and wait: the worker's value, or its error raised here
        (a :class:`WorkerCrashed` when the worker dies first)."""
        answers: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        with self._lock:
            if self.fault is not None:
                raise self.fault
            rid = next(self._ids)
            self.pending[rid] = answers
        try:
            self.send((kind, rid, *args))
            msg = answers.get()
        finally:
            with self._lock:
                self.pending.pop(rid, None)
        if msg[0] == "result":
            return msg[1]
        raise msg[1]

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # a message we cannot read: the worker is no longer trusted
                log.exception("unreadable message from %s worker %d", self.label, self.pid)
                self.proc.kill()
                break
            self._route(msg)
        rc = self._reap()
        self.returncode = rc
        ended = how_it_ended(rc, self._runtime) if self.hung is None else \
            f"hung ({self.hung}) and was killed"
        fault = WorkerCrashed(
            f"the {self.label} worker for model {self.model!r} (pid {self.pid}) "
            f"{ended}; the request on it is lost and the worker is "
            "restarted — retry (the daemon log holds the worker's last words)", field="model")
        with self._lock:
            self.fault = fault
            lost = list(self.pending.values())
            self.pending.clear()
        self.in_flight_lost = len(lost)
        try:
            if not self.closing:
                # before the requests hear of it: whoever they tell finds the fault reported
                self._on_death(self)
        finally:
            for answers in lost:
                answers.put(("error", fault))
            self._after_death()
            self.dead.set()

    def _reap(self) -> int | None:
        with contextlib.suppress(OSError):
            self.conn.close()
        try:
            return self.proc.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # the connection broke but it lives: end it
            self.proc.kill()
            return self.proc.wait()

    def close(self) -> None:
        """Ask the worker to leave; killed if it does not in time."""
        self.closing = True
        with contextlib.suppress(WorkerCrashed):
            self.send(("close",))
        if not self.dead.wait(CLOSE_TIMEOUT_S):
            log.warning("%s worker %d did not leave in %.0f s; killing it", self.label,
                        self.pid, CLOSE_TIMEOUT_S)
            self.proc.kill()
            self.dead.wait(CLOSE_TIMEOUT_S)
