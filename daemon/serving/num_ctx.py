"""The context a request may ask a GGUF model to be loaded with (Ollama's ``options.num_ctx``).

Ollama reloads a model whose loaded context differs from the one a request asks for. Here the
same holds, bounded twice: by the context the model was trained for (``n_ctx_train`` in its
GGUF header; llama.cpp would run past it, but the answers degrade), and by the memory budget
(weights + the KV cache of that context must fit beside the models that have requests in
flight, idle ones being evicted as for any load). Asking more is a 400 naming
``options.num_ctx`` with the largest context allowed and why.

With ``[backends.llamacpp] parallel`` N, ``num_ctx`` is each request's share, as in Ollama
(which allocates ``num_ctx`` x its parallel requests): the model loads with N x ``num_ctx``.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgepilot.errors import CommandError
from edgepilot.formats.gguf_info import COMPUTE_OVERHEAD_BYTES, CTX_PAD, GgufInfo

MIN_NUM_CTX = 16  # as [backends.llamacpp] n_ctx allows
MiB = 1024 * 1024


@dataclass(frozen=True)
class NumCtxLimit:
    """The largest ``num_ctx`` a request may ask of one model now, and what sets it."""

    allowed: int
    why: str

    def check(self, model: str, num_ctx: int) -> None:
        """CommandError (400) naming ``options.num_ctx`` when ``num_ctx`` is outside
        ``MIN_NUM_CTX..allowed``."""
        if MIN_NUM_CTX <= num_ctx <= self.allowed:
            return
        raise CommandError(f"options.num_ctx is {num_ctx}; allowed {MIN_NUM_CTX}.."
                           f"{self.allowed} for model {model!r} ({self.why})",
                           field="options.num_ctx")


def num_ctx_limit(info: GgufInfo, *, budget: int, busy: int, parallel: int,
                  kv_type: str) -> NumCtxLimit:
    """The limit for a model of header ``info``: ``budget`` bytes in all, ``busy`` of them held
    by other models with requests in flight (those cannot be evicted to make room)."""
    per_cell = info.kv_bytes(CTX_PAD, kv_type) / CTX_PAD  # KV bytes of one context token
    room = budget - busy - info.weights_bytes - COMPUTE_OVERHEAD_BYTES
    fits_total = int(room // per_cell) // CTX_PAD * CTX_PAD if room > 0 and per_cell else 0
    fits = fits_total // max(1, parallel)
    memory = (f"the memory budget of {budget / MiB:.0f} MiB holds weights "
              f"{info.weights_bytes / MiB:.1f} MiB + the KV cache of {fits} tokens"
              + (f" x {parallel} parallel sequences" if parallel > 1 else "")
              + (f" beside {busy / MiB:.1f} MiB of models in use" if busy else ""))
    if info.n_ctx_train and info.n_ctx_train <= fits:
        return NumCtxLimit(info.n_ctx_train, f"the context it was trained for, n_ctx_train "
                                             f"{info.n_ctx_train}")
    return NumCtxLimit(max(0, fits), memory)


def asked_num_ctx(value: int | None) -> int | None:
    """A request's ``options.num_ctx`` as a context to load with: None (absent, 0 or negative)
    keeps the model's context as it is."""
    return value if value is not None and value > 0 else None
