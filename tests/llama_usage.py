"""Usage compared with llama-cpp-python's own: its counts only (it reports no
``prompt_tokens_details``; how many prompt tokens came from the KV cache depends on what the
context held before, see tests/test_prefix_cache.py)."""

from __future__ import annotations

from typing import Any


def counts(usage: Any) -> dict[str, int]:
    """``prompt_tokens``, ``completion_tokens`` and ``total_tokens`` of ``usage``."""
    return {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
