"""Building a GGUF model's plan state from the config: the llama.cpp backend, the measuring
options and what its cached plan depends on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgepilot import __version__
from edgepilot.backends.llamacpp.backend import LlamaCppBackend
from edgepilot.board.board import Board
from edgepilot.config import Config
from edgepilot.dispatch.gguf.plans import GgufDispatch, GgufOptions
from edgepilot.dispatch.measuring.measure import Progress
from edgepilot.dispatch.planning.cache import PlanCache
from edgepilot.dispatch.targets import board_id


def gguf_dispatch(config: Config, name: str, path: Path, backend: LlamaCppBackend, *,
                  board: Board | None, profile: str | None,
                  cache: PlanCache, budgets: dict[str, float], progress: Progress,
                  emit: Callable[..., Any], hold: Any = None) -> GgufDispatch:
    """The plan state of the GGUF model ``name`` (nothing measured yet)."""
    entry = next((e for e in config.models if e.name == name), None)
    n_ctx = entry.n_ctx if entry is not None and entry.n_ctx else config.backends.llamacpp.n_ctx
    d = config.dispatch
    opts = GgufOptions(n_ctx=n_ctx, threads=d.gguf_threads, prompt_tokens=d.gguf_prompt_tokens,
                       decode_tokens=d.gguf_decode_tokens)
    parts = {"board": board_id(board), "profile": profile,
             "runtimes": {"llamacpp": str(backend.version() or "?")}, "edgepilot": __version__}
    return GgufDispatch(name, path, backend, opts, cache=cache, key_parts=parts,
                        budgets=budgets, progress=progress, emit=emit, hold=hold)
