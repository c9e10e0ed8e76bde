"""One queue per physical device: one piece of work inside a device at a time, a bounded line.

Every target maps to the physical device that runs it (``onnxruntime/cpu``, ``tflite/xnnpack``,
``armnn/CpuRef`` and ``llamacpp/cpu`` all share ``cpu``): runtimes on one device compete for
the same cores or the same accelerator, so running two at once only makes both slower and
their latencies unpredictable. A request's segment holds its device only while it runs, so a
plan that spans two devices pipelines consecutive requests across them.

The slot can be taken from the event loop (``await acquire()``: requests, with the
``[http] max_queue`` limit that turns an overlong line into a 503) or from a worker thread
(``with hold():``: a llama.cpp decode step, the daemon's own measurements). Waiters of both
kinds are served first come, first served; a released slot passes straight to the next waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from edgepilot.dispatch.planning.plan import device_of
from edgepilot.errors import BusyError, PlanError

# how long a measurement waits for the devices before giving up (requests keep them busy)
HOLD_TIMEOUT_S = 300.0


@dataclass(eq=False)
class _Waiter:
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[None] | None = None
    event: threading.Event = field(default_factory=threading.Event)
    granted: bool = False


class DeviceQueue:
    """One slot per device; at most ``max_waiting`` requests wait, the next gets BusyError."""

    def __init__(self, name: str, max_waiting: int) -> None:
        self.name = name
        self.max_waiting = max_waiting
        self.waiting = 0  # requests (loop side) in line; threads are not counted
        self.busy = False
        self.served = 0   # slots handed out, for status and tests
        self.closed = False  # the daemon is stopping: threads no longer wait for the slot
        self._lock = threading.Lock()
        self._line: deque[_Waiter] = deque()

    @property
    def queued(self) -> int:
        """Waiters of both kinds (requests and the daemon's own threads) in line now."""
        return len(self._line)

    # ---- loop side ---------------------------------------------------------------------------
    async def acquire(self, *, limit: bool = True) -> None:
        """Take the device, waiting in line; pair with :meth:`release`.

        ``limit=False`` waits whatever the line's length (work the daemon itself must do)."""
        with self._lock:
            if not self.busy:
                self.busy = True
                self.served += 1
                return
            if limit and self.waiting >= self.max_waiting:
                raise BusyError(
                    f"device {self.name} is busy with {self.waiting} request(s) waiting "
                    f"(limit [http] max_queue = {self.max_waiting}); retry later",
                    field="model")
            loop = asyncio.get_running_loop()
            waiter = _Waiter(loop, loop.create_future())
            self._line.append(waiter)
            self.waiting += 1
        assert waiter.future is not None
        try:
            await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                if waiter in self._line:  # still in line: just leave it
                    self._line.remove(waiter)
                    self.waiting -= 1
                    raise
            if waiter.future.done() and not waiter.future.cancelled():
                self.release()  # handed over as we were cancelled: pass it on
            # else the hand-over callback sees the cancelled future and passes it on
            raise

    @contextlib.asynccontextmanager
    async def slot(self, *, limit: bool = True) -> AsyncIterator[None]:
        """Hold the device for the body of an ``async with``."""
        await self.acquire(limit=limit)
        try:
            yield
        finally:
            self.release()

    # ---- thread side -------------------------------------------------------------------------
    def take(self, timeout_s: float | None = None) -> bool:
        """Take the device from a worker thread (no line limit); False on timeout or once
        the queue is closed (a stopping daemon must not leave threads waiting)."""
        with self._lock:
            if not self.busy:
                self.busy = True
                self.served += 1
                return True
            if self.closed:
                return False
            waiter = _Waiter()
            self._line.append(waiter)
        if waiter.event.wait(timeout_s):
            return waiter.granted
        with self._lock:
            if waiter in self._line:
                self._line.remove(waiter)
                return False
        return True  # handed over just as the wait ran out: it is ours

    def close(self) -> None:
        """The daemon is stopping: threads waiting for the slot give up (``take`` is False);
        requests in line still get it in turn as the ones ahead finish."""
        with self._lock:
            self.closed = True
            for waiter in [w for w in self._line if w.future is None]:
                self._line.remove(waiter)
                waiter.event.set()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the device from a worker thread for the body of a ``with``."""
        self.take()
        try:
            yield
        finally:
            self.release()

    # ---- both --------------------------------------------------------------------------------
    def release(self) -> None:
        """Give the device back; the next waiter (loop or thread) gets it at once."""
        with self._lock:
            if not self._line:
                self.busy = False
                return
            waiter = self._line.popleft()
            self.served += 1
            if waiter.future is None:
                waiter.granted = True
                waiter.event.set()
                return
            self.waiting -= 1
        assert waiter.loop is not None
        try:
            waiter.loop.call_soon_threadsafe(self._hand_over, waiter)
        except RuntimeError:  # its loop is closed (the daemon is exiting): nobody will take it
            self.release()

    def _hand_over(self, waiter: _Waiter) -> None:
        assert waiter.future is not None
        if waiter.future.cancelled():
            self.release()
        else:
            waiter.future.set_result(None)


class DeviceQueues:
    """The queues of every physical device, created on first use."""

    def __init__(self, max_waiting: int,
                 loop: Callable[[], asyncio.AbstractEventLoop | None] = lambda: None) -> None:
        """``loop()``: the daemon's event loop once it runs (None before, and in the CLI)."""
        self.max_waiting = max_waiting
        self._loop = loop
        self.closed = False
        self._queues: dict[str, DeviceQueue] = {}
        self._lock = threading.Lock()

    def queue(self, device: str) -> DeviceQueue:
        """The queue of a physical device name (``cpu``, ``gpu``, ``qnn`` ...)."""
        with self._lock:
            q = self._queues.get(device)
            if q is None:
                q = self._queues[device] = DeviceQueue(device, self.max_waiting)
                q.closed = self.closed
            return q

    def for_target(self, target: str) -> DeviceQueue:
        """The queue of the device a target (``backend/device/precision``) runs on."""
        return self.queue(device_of(target))

    def set_limit(self, max_waiting: int) -> None:
        """A reloaded ``[http] max_queue`` applies to the lines from now on."""
        with self._lock:
            self.max_waiting = max_waiting
            for q in self._queues.values():
                q.max_waiting = max_waiting

    def close(self) -> None:
        """Stopping: threads waiting for a device (measurements) give up at once."""
        with self._lock:
            self.closed = True
            queues = list(self._queues.values())
        for q in queues:
            q.close()

    def snapshot(self) -> dict[str, dict[str, int | bool]]:
        """Plain data for status: per device, busy, waiting and slots served."""
        with self._lock:
            return {n: {"busy": q.busy, "waiting": q.waiting, "served": q.served}
                    for n, q in sorted(self._queues.items())}

    @contextlib.contextmanager
    def hold_all(self, timeout_s: float, extra: tuple[str, ...] = ("cpu",)) -> Iterator[None]:
        """From a worker thread: hold every device (in name order, so two holders never
        deadlock) for the body of a ``with``. The daemon's own measurements use it: no request
        runs while a round is timed, and one in progress is waited for first."""
        for name in extra:
            self.queue(name)
        with self._lock:
            queues = [self._queues[n] for n in sorted(self._queues)]
        held: list[DeviceQueue] = []
        deadline = time.monotonic() + timeout_s
        try:
            for q in queues:
                if not q.take(max(0.0, deadline - time.monotonic())):
                    if q.closed:
                        raise PlanError("nothing could be measured alone: the daemon is "
                                        "stopping", field="model")
                    raise PlanError(
                        f"nothing could be measured alone: device {q.name} stayed busy for "
                        f"{timeout_s:.0f} s; retry when traffic is lower (plan.replan)",
                        field="model")
                held.append(q)
            yield
        finally:
            for q in reversed(held):
                q.release()

    def hold_devices(self) -> AbstractContextManager[Any]:
        """For the daemon's own measurements, from a worker thread: hold every device queue
        for the body of a ``with``, so that no request runs while a round is timed (the cores
        are shared by every runtime). A no-op outside a running daemon (CLI) and on the loop's
        own thread, which must never block."""
        loop = self._loop()
        if loop is None or not loop.is_running():
            return nullcontext()
        try:
            if asyncio.get_running_loop() is loop:
                return nullcontext()
        except RuntimeError:
            pass
        return self.hold_all(HOLD_TIMEOUT_S)
