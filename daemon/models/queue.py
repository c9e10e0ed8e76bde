"""Per-device serialisation: one request inside a runtime at a time, a bounded line outside."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from edgepilot.errors import BusyError


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

    async def acquire(self) -> None:
        """Take the device (waiting in line); pair with :meth:`release` (used by streams)."""
        if self.busy and self.waiting >= self.max_waiting:
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
