"""A resident model and its bookkeeping (in use, last use, keep-alive), and the errors and waits
of making room for another (:class:`~edgepilot.serving.registry.ModelRegistry` owns them)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from edgepilot.backends.base import Executable
from edgepilot.errors import ModelError
from edgepilot.formats import files


class ModelTooLarge(ModelError):
    """Loading would exceed the memory budget; the message carries the numbers."""

    code = "model_too_large"
    http_status = 507


@dataclass
class LoadedModel:
    """A resident model: its whole-model executable and bookkeeping for keep-alive."""

    model: files.ResolvedModel
    executable: Executable
    memory_bytes: int
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    in_use: int = 0
    # set on every release: unload waits on it until in_use is 0
    released: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    # a request's keep_alive (Ollama's): idle seconds before unloading, math.inf = never;
    # None = the [[models]] entry's keep_alive_s
    keep_alive_s: float | None = None
    # the context a GGUF was loaded with (all its sequences'; 0 for other kinds): a request
    # asking another (Ollama's options.num_ctx) reloads it
    n_ctx: int = 0

    def keep_alive(self) -> float:
        """Idle seconds after which this model is unloaded (``math.inf``: never)."""
        return self.model.entry.keep_alive_s if self.keep_alive_s is None else self.keep_alive_s

    def expires_at(self) -> float | None:
        """Wall-clock time (epoch seconds) of the idle unload if nothing uses the model till
        then; None when it is kept loaded."""
        keep = self.keep_alive()
        if math.isinf(keep):
            return None
        idle = 0.0 if self.in_use else time.monotonic() - self.last_used
        return time.time() + max(0.0, keep - idle)


async def any_released(models: Sequence[LoadedModel], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for a request on one of ``models`` to finish; whether one
    did. (Called with no await since ``in_use`` was read, so no release is missed.)"""
    for lm in models:
        lm.released.clear()
    waits = [asyncio.ensure_future(lm.released.wait()) for lm in models]
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return bool(done)
