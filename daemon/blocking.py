"""How async code runs blocking work (sysfs, native inference, file hashing) off the loop.

The composition root owns the thread pool; components receive its :class:`RunBlocking`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class RunBlocking(Protocol):
    """``await run_blocking(fn, *args)``: ``fn(*args)`` in a worker thread, its result back."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...
