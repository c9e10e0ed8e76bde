"""The worker side of a worker link, for any runtime: the receive loop, written once.

A worker process (``edgepilot worker <backend> <model> --fd N``) reads messages from the
daemon on fd ``N`` until the daemon closes the connection, says ``("close",)``, or dies (the
kernel closes a killed daemon's end: EOF), so no worker outlives its daemon. The first message
is ``("open", options)``, answered ``("ready", facts)`` by :meth:`WorkerLoop.open` or
``("failed", error)``; every other message goes to :meth:`WorkerLoop.handle`. Replies go out
through :meth:`WorkerLoop.send`, which any thread may call.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from abc import ABC, abstractmethod
from multiprocessing.connection import Connection
from typing import Any

from edgepilot.backends.workers.exits import error_data


class WorkerLoop(ABC):
    """One worker's connection to its daemon and the loop that serves it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.send_lock = threading.Lock()

    def send(self, msg: tuple[Any, ...]) -> None:
        """Send one message to the daemon (thread-safe)."""
        with self.send_lock:
            self.conn.send(msg)

    @abstractmethod
    def open(self, options: dict[str, Any]) -> None:
        """Load what the daemon asks for and send ``("ready", facts)``; raise on failure."""

    @abstractmethod
    def handle(self, msg: tuple[Any, ...]) -> None:
        """One message after ``open`` (a request, a cancel ...); must not raise."""

    def finish(self, asked: bool) -> None:  # noqa: B027 - optional hook
        """The loop ends: ``asked`` when the daemon said close, else it went away (EOF)."""

    def serve(self) -> int:
        """Read messages until the daemon closes the connection; 0 on a clean end, 1 when
        ``open`` failed."""
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.finish(asked=False)  # the daemon went away: nothing left to serve
                return 0
            kind = msg[0]
            if kind == "open":
                try:
                    self.open(msg[1])
                except Exception as exc:
                    self.send(("failed", error_data(exc)))
                    return 1
            elif kind == "close":
                self.finish(asked=True)
                return 0
            else:
                self.handle(msg)


def run(loop: WorkerLoop) -> int:
    """Serve ``loop`` until it ends, then leave the process at once (a runtime's threads and
    work in flight need no goodbye)."""
    # the daemon's Ctrl-C reaches the whole process group: the daemon decides when we stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rc = 1
    try:
        rc = loop.serve()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
