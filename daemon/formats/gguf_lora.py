"""Whether a LoRA adapter GGUF fits a base model, from the two headers alone.

llama.cpp checks an adapter's tensors against the base as it loads it, but a mismatch it does
not foresee can crash the process; the daemon refuses an adapter before llama.cpp sees it.
The rules are llama.cpp's (``llama_adapter_lora_init``): ``general.type = "adapter"``,
``adapter.type = "lora"``, the base's architecture, ``adapter.lora.alpha``, and for every
``<tensor>.lora_a`` / ``<tensor>.lora_b`` pair a base tensor of that name with
``a = [n_in, r]``, ``b = [r, n_out]`` (ggml order) for a base ``[n_in, n_out]``
(the token embedding: ``a = [r, n_out]``, ``b = [n_in, r]``).
"""

from __future__ import annotations

from pathlib import Path

from edgepilot.errors import ModelError
from edgepilot.formats.gguf_header import read_header

# the element types llama.cpp's convert_lora_to_gguf writes (each has a CPU matmul kernel)
LORA_TYPES = ("f32", "f16", "bf16", "q8_0")
_KEYS = {"general.type", "general.architecture", "adapter.type", "adapter.lora.alpha"}


def check_lora(base: Path, adapter: Path, *, field: str = "adapters") -> int:
    """ModelError (one line naming the adapter file and what does not fit) unless ``adapter``
    is a LoRA adapter for ``base``; the number of adapted tensors otherwise."""
    def refuse(why: str) -> ModelError:
        return ModelError(f"LoRA adapter {adapter.name} does not fit {base.name}: {why}",
                          field=field)

    head = read_header(adapter, _KEYS)
    base_head = read_header(base, {"general.architecture"})
    f = head.fields
    if f.get("general.type") != "adapter" or f.get("adapter.type") != "lora":
        raise refuse(f"it is not a LoRA adapter (general.type {f.get('general.type')!r}, "
                     f"adapter.type {f.get('adapter.type')!r}; want 'adapter' and 'lora')")
    arch, base_arch = f.get("general.architecture"), base_head.fields.get("general.architecture")
    if arch != base_arch:
        raise refuse(f"it is for architecture {arch!r}, the model is {base_arch!r}")
    if not isinstance(f.get("adapter.lora.alpha"), float | int):
        raise refuse("it has no adapter.lora.alpha")
    dims = {t.name: t.dims for t in base_head.tensors}
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    for t in head.tensors:
        name, _, part = t.name.rpartition(".")
        if part not in ("lora_a", "lora_b") or len(t.dims) != 2:
            raise refuse(f"tensor {t.name!r} is not a 2-D .lora_a/.lora_b tensor")
        if t.type_name not in LORA_TYPES:
            # llama.cpp loads any type, then crashes in the first matmul without a kernel
            raise refuse(f"tensor {t.name!r} is {t.type_name}; allowed: {', '.join(LORA_TYPES)}")
        pairs.setdefault(name, {})[part] = t.dims
    if not pairs:
        raise refuse("it adapts no tensor")
    for name, pair in pairs.items():
        if len(pair) != 2:
            raise refuse(f"tensor {name!r} has only its {next(iter(pair))}")
        if name not in dims or len(dims[name]) != 2:
            raise refuse(f"the model has no 2-D tensor {name!r}")
        (n_in, n_out), a, b = dims[name], pair["lora_a"], pair["lora_b"]
        embd = name == "token_embd.weight"
        fits = (a[1] == n_out and b[0] == n_in and a[0] == b[1]) if embd else (
            a[0] == n_in and b[1] == n_out and a[1] == b[0])
        if not fits:
            raise refuse(f"tensor {name!r} is {list(dims[name])} in the model, the adapter's "
                         f"lora_a {list(a)} / lora_b {list(b)} do not match it")
    return len(pairs)


def write_lora(path: Path, base: Path, *, targets: tuple[str, ...] = ("attn_q", "attn_v"),
               rank: int = 8, alpha: float = 16.0, scale: float = 1.0, seed: int = 0) -> Path:
    """Write a random LoRA adapter GGUF for ``base`` (every block's ``targets`` weights, F32)
    to ``path``: a real adapter llama.cpp loads, for tests and demos (no LoRA GGUF ships in a
    registry package). ``scale`` sizes the change it makes to the model's output."""
    import gguf
    import numpy as np

    head = read_header(base, {"general.architecture"})
    arch = str(head.fields["general.architecture"])
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for t in head.tensors:
        parts = t.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in targets:
            continue
        n_in, n_out = t.dims
        # numpy shapes are ggml's reversed: a = [n_in, r], b = [r, n_out]
        # (cast last: a float64 scalar would make the tensors F64, which llama.cpp loads and
        # then crashes on — no CPU matmul kernel)
        a = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal((n_out, rank)) * scale / np.sqrt(rank)).astype(np.float32)
        w.add_tensor(f"{t.name}.lora_a", a)
        w.add_tensor(f"{t.name}.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
