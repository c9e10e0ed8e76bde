"""Per-device serialisation: one request inside a runtime at a time, a bounded line outside."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from edgepilot.errors import BusyError, PlanError


class DeviceQueue:
    """One slot per device; at most ``max_waiting`` callers wait, the next one gets BusyError."""

    def __init__(self, name: str, max_waiting: int) -> None:
        self.name = name
        self.max_waiting = max_waiting
        self.waiting = 0
        self.busy = False
        self._sem = asyncio.Semaphore(1)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold the device for the body of the ``async with``."""
        await self.acquire()
        try:
            yield
        finally:
            self.release()

    async def acquire(self, *, limit: bool = True) -> None:
        """Take the device (waiting in line); pair with :meth:`release` (used by streams).

        ``limit=False`` waits whatever the line's length (the daemon's own measurements, which
        must not be refused like a client)."""
        if limit and self.busy and self.waiting >= self.max_waiting:
            raise BusyError(f"device {self.name} is busy with {self.waiting} request(s) waiting "
                            f"(limit [http] max_queue = {self.max_waiting}); retry later",
                            field="model")
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        self.busy = True

    def release(self) -> None:
        self.busy = False
        self._sem.release()


class ThreadHold:
    """Hold device queues from a worker thread for the body of a ``with``.

    The daemon's own measurements (a GGUF plan timing thread counts) run in worker threads
    while the loop serves requests; holding the queues there means no request runs while a
    round is timed, and a request in progress is waited for first. The queues are taken in
    name order, each without the ``max_queue`` limit.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 queues: Callable[[], list[DeviceQueue]], timeout_s: float) -> None:
        self.loop = loop
        self.queues = queues
        self.timeout_s = timeout_s
        self._held: list[DeviceQueue] = []

    async def _take(self) -> list[DeviceQueue]:
        held: list[DeviceQueue] = []
        try:
            for q in sorted(self.queues(), key=lambda q: q.name):
                await q.acquire(limit=False)
                held.append(q)
        except BaseException:
            for q in held:
                q.release()
            raise
        return held

    def _release(self, held: list[DeviceQueue]) -> None:
        for q in held:
            q.release()

    def __enter__(self) -> ThreadHold:
        fut = asyncio.run_coroutine_threadsafe(self._take(), self.loop)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self._held = fut.result(timeout=0.5)
                return self
            except concurrent.futures.TimeoutError:
                # a loop that stopped (the daemon is exiting) will never hand the devices over
                stopped = self.loop.is_closed() or not self.loop.is_running()
                if not stopped and time.monotonic() < deadline:
                    continue
            with contextlib.suppress(RuntimeError):  # a closed loop takes no callbacks
                if not fut.cancel() and fut.done() and fut.exception() is None:
                    # taken just as the wait ran out: give them back, nothing will run
                    self.loop.call_soon_threadsafe(self._release, fut.result())
            why = ("the daemon is stopping" if stopped else
                   f"the devices stayed busy for {self.timeout_s:.0f} s; retry when traffic is "
                   "lower (plan.replan)")
            raise PlanError(f"nothing could be measured alone: {why}", field="model")

    def __exit__(self, *exc: object) -> None:
        held, self._held = self._held, []
        if held and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._release, held)
