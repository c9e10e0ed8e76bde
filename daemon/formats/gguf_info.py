"""What a GGUF file needs in memory, read from its header before anything is loaded.

The header is read by :mod:`edgepilot.formats.gguf_header` without the tokenizer's tables, so
this costs milliseconds, not the seconds a full ``gguf.GGUFReader`` parse takes.

Weights are the sum of the tensor bytes in the file; the KV cache is
``2 (K and V) × layers × ctx × kv_heads × head_dim × bytes per element`` for the KV type.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from edgepilot.errors import ModelError
from edgepilot.formats.gguf_header import read_header

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
    block_bytes: int = 0  # bytes of the ``blk.N.*`` tensors (what offloading a block moves)
    pooling: int = 0  # llama.cpp's pooling type: > 0 for an embedding model (1 mean, 2 cls, ...)
    file_type: str = ""  # the quantization the file was made with (``general.file_type``)
    size_label: str = ""  # its parameter count as its maker wrote it ("135M")

    def kv_bytes(self, n_ctx: int, kv_type: str = "f16") -> int:
        """KV cache size for ``n_ctx`` tokens (padded as llama.cpp pads it)."""
        return int(2 * self.n_layers * effective_ctx(n_ctx) * self.n_kv_heads * self.head_dim
                   * KV_BYTES[kv_type])

    def estimate_bytes(self, n_ctx: int, kv_type: str = "f16") -> int:
        """Resident estimate: weights + KV cache + compute-buffer margin."""
        return self.weights_bytes + self.kv_bytes(n_ctx, kv_type) + COMPUTE_OVERHEAD_BYTES


def _wanted(key: str) -> bool:
    # everything but the tokenizer's tables (tokens, scores, types, merges: most of a header)
    return key == "tokenizer.chat_template" or not key.startswith("tokenizer.")


_cache: dict[tuple[str, int, int], GgufInfo] = {}
_cache_lock = threading.Lock()
_CACHE_SIZE = 32


def read_gguf_info(path: Path) -> GgufInfo:
    """Parse ``path``'s header (no weights, no token table read); ModelError if it is not a
    usable GGUF. Cached by (path, mtime, size): loads, plans and budget checks of one file
    share one parse."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ModelError(f"{path.name} cannot be read: {exc.strerror or exc}",
                         field="file") from None
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    info = _parse_info(path)
    with _cache_lock:
        if len(_cache) >= _CACHE_SIZE:
            _cache.pop(next(iter(_cache)))
        _cache[key] = info
    return info


def _parse_info(path: Path) -> GgufInfo:
    header = read_header(path, _wanted)
    fields = header.fields
    arch = fields.get("general.architecture")
    if not arch:
        raise ModelError(f"{path.name}: GGUF has no general.architecture", field="file")
    n_layers = fields.get(f"{arch}.block_count")
    n_embd = fields.get(f"{arch}.embedding_length")
    n_heads = fields.get(f"{arch}.attention.head_count")
    if not (n_layers and n_embd and n_heads):
        raise ModelError(f"{path.name}: GGUF lacks {arch}.block_count/embedding_length/"
                         "attention.head_count; cannot estimate its memory", field="file")
    if isinstance(n_heads, list):  # per-layer head counts in some archs
        n_heads = max(n_heads)
    n_kv = fields.get(f"{arch}.attention.head_count_kv", n_heads)
    if isinstance(n_kv, list):
        n_kv = max(n_kv)
    head_dim = fields.get(f"{arch}.attention.key_length", n_embd // n_heads)
    # the dominant weight type among 2-D tensors names the file's precision (e.g. q4_0)
    kinds = Counter(t.type_name for t in header.tensors if len(t.dims) >= 2)
    weight_type = kinds.most_common(1)[0][0] if kinds else "unknown"
    return GgufInfo(
        arch=str(arch), n_layers=int(n_layers), n_embd=int(n_embd), n_heads=int(n_heads),
        n_kv_heads=int(n_kv), head_dim=int(head_dim),
        n_ctx_train=int(fields.get(f"{arch}.context_length", 0) or 0),
        weights_bytes=sum(t.n_bytes for t in header.tensors),
        weight_type=weight_type, chat_template=fields.get("tokenizer.chat_template"),
        block_bytes=sum(t.n_bytes for t in header.tensors if t.name.startswith("blk.")),
        pooling=int(fields.get(f"{arch}.pooling_type", 0) or 0),
        file_type=FILE_TYPES.get(fields.get("general.file_type", -1), ""),
        size_label=str(fields.get("general.size_label", "") or ""))


# llama.cpp's ``llama_ftype`` names, as Ollama shows a file's quantization (a Q4_K_M file's
# most common tensor type is Q5_0 or Q6_K on some layers' mix, not what it was made as)
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
              10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
              16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
              22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
              28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
              37: "TQ2_0"}
