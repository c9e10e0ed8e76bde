"""What a GGUF file needs in memory, read from its header before anything is loaded.

Weights are the sum of the tensor bytes in the file; the KV cache is
``2 (K and V) × layers × ctx × kv_heads × head_dim × bytes per element`` for the KV type.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepilot.errors import ModelError

# bytes per element of the KV cache types llama.cpp offers (q8_0/q4_0 are 32-element blocks)
KV_BYTES: dict[str, float] = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
# llama.cpp reserves compute buffers next to weights and KV; a flat margin keeps estimates honest
COMPUTE_OVERHEAD_BYTES = 32 * 1024 * 1024
# llama.cpp pads the context to a multiple of 256 cells; the KV cache is sized on that
CTX_PAD = 256


def effective_ctx(n_ctx: int) -> int:
    """The context length llama.cpp actually allocates for a requested ``n_ctx``."""
    return max(CTX_PAD, -(-n_ctx // CTX_PAD) * CTX_PAD)


@dataclass(frozen=True)
class GgufInfo:
    """The header facts the memory estimate and the planner need."""

    arch: str
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_ctx_train: int
    weights_bytes: int
    weight_type: str
    chat_template: str | None

    def kv_bytes(self, n_ctx: int, kv_type: str = "f16") -> int:
        """KV cache size for ``n_ctx`` tokens (padded as llama.cpp pads it)."""
        return int(2 * self.n_layers * effective_ctx(n_ctx) * self.n_kv_heads * self.head_dim
                   * KV_BYTES[kv_type])

    def estimate_bytes(self, n_ctx: int, kv_type: str = "f16") -> int:
        """Resident estimate: weights + KV cache + compute-buffer margin."""
        return self.weights_bytes + self.kv_bytes(n_ctx, kv_type) + COMPUTE_OVERHEAD_BYTES


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def read_gguf_info(path: Path) -> GgufInfo:
    """Parse ``path``'s header (mmap, no weights read); ModelError if it is not a usable GGUF."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise ModelError(f"{path.name} is not a readable GGUF file: {exc}", field="file") from None
    arch = _field(reader, "general.architecture")
    if not arch:
        raise ModelError(f"{path.name}: GGUF has no general.architecture", field="file")
    n_layers = _field(reader, f"{arch}.block_count")
    n_embd = _field(reader, f"{arch}.embedding_length")
    n_heads = _field(reader, f"{arch}.attention.head_count")
    if not (n_layers and n_embd and n_heads):
        raise ModelError(f"{path.name}: GGUF lacks {arch}.block_count/embedding_length/"
                         "attention.head_count; cannot estimate its memory", field="file")
    if isinstance(n_heads, list):  # per-layer head counts in some archs
        n_heads = max(n_heads)
    n_kv = _field(reader, f"{arch}.attention.head_count_kv", n_heads)
    if isinstance(n_kv, list):
        n_kv = max(n_kv)
    head_dim = _field(reader, f"{arch}.attention.key_length", n_embd // n_heads)
    # the dominant weight type among 2-D tensors names the file's precision (e.g. q4_0)
    kinds = Counter(t.tensor_type.name.lower() for t in reader.tensors if len(t.shape) >= 2)
    weight_type = kinds.most_common(1)[0][0] if kinds else "unknown"
    return GgufInfo(
        arch=str(arch), n_layers=int(n_layers), n_embd=int(n_embd), n_heads=int(n_heads),
        n_kv_heads=int(n_kv), head_dim=int(head_dim),
        n_ctx_train=int(_field(reader, f"{arch}.context_length", 0) or 0),
        weights_bytes=int(sum(int(t.n_bytes) for t in reader.tensors)),
        weight_type=weight_type, chat_template=_field(reader, "tokenizer.chat_template"))
