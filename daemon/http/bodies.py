"""Request bodies decoded off the event loop, a few at a time.

A 16 MB JSON tensor body takes over a second to parse and turn into arrays; on the loop that
stalls every other request (``/healthz`` included). Parsing runs in the loop's default thread
pool instead, never more than :data:`MAX_PARSING` at once, so a burst of large bodies neither
stalls the loop nor multiplies the memory they take while parsed.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from edgepilot.errors import CommandError

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


def parse_json(raw: bytes, empty: Any = None) -> Any:
    """``json.loads`` whose every failure is a 400 naming the body (blocking).

    Nesting deeper than Python's recursion limit raises RecursionError inside the parser,
    which would otherwise surface as a plain-text 500.
    """
    if empty is not None and not raw.strip():
        return empty
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CommandError(f"body is not JSON: {exc}", field="body") from None
    except RecursionError:
        raise CommandError("body is nested too deeply to be a request", field="body") from None
