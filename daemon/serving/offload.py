"""Request bodies decoded (and answers encoded) off the event loop, a few at a time.

A 16 MB JSON tensor body takes over a second to parse and turn into arrays; on the loop that
stalls every other request (``/healthz`` included). Decoding runs in the loop's default thread
pool instead (never the inference executor's threads), never more than :data:`MAX_PARSING`
at once, so a burst of large bodies neither stalls the loop nor multiplies the memory they
take while decoded. HTTP and MQTT both decode through :func:`off_loop`.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
MAX_PARSING = 2
# one bound per event loop (tests run several daemons, each on its own loop)
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary())


def _slot() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    sem = _slots.get(loop)
    if sem is None:
        sem = _slots[loop] = asyncio.Semaphore(MAX_PARSING)
    return sem


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run a CPU-bound decode/encode ``fn(*args)`` in a worker thread, bounded."""
    async with _slot():
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
