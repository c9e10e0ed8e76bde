"""Random-weight GGUF models (llama architecture) for tests and demos.

The files are real llama.cpp models — real tokenizer, real chat template, real tensor layout —
only the weights are random, so generation is gibberish but deterministic at temperature 0.
Everything is written with the ``gguf`` package; nothing is downloaded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

# gguf's writer logs three INFO lines (endianness, file list) for every file it writes
logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)
Tokenizer = Literal["spm", "bpe"]
WeightType = Literal["f16", "q8_0", "q4_0"]

# A small ChatML template; llama-cpp-python renders it with jinja2 from the GGUF metadata.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = ("the", "a", "edge", "board", "model", "hello", "world", "power", "fast", "slow",
          "cpu", "gpu", "npu", "token", "layer", "plan", "you", "are", "is", "and")


@dataclass(frozen=True)
class GgufSpec:
    """Shape of the generated model; widths must be multiples of 32 (quant block size)."""

    n_layers: int = 2
    n_embd: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    n_ff: int = 128
    # = [backends.llamacpp] n_ctx's default: served at that context, llama.cpp would warn
    # (n_ctx_seq > n_ctx_train) on every load of the demo and doctor's probe model
    n_ctx_train: int = 2048
    tokenizer: Tokenizer = "spm"
    weight_type: WeightType = "q8_0"
    seed: int = 0
    # another GGUF whose tokenizer (token table, merges, special ids, chat template) is copied
    # instead of the generated one: a random model of a real model's vocabulary (``tokenizer``
    # is then ignored)
    tokenizer_from: Path | None = None
    # llama.cpp's pooling (1 mean, 2 cls, 3 last): an embedding model's header says so
    pooling_type: int = 0


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def _spm_vocab() -> tuple[list[str], list[float], list[int]]:
    from gguf import TokenType

    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL,
             TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    pieces = ["▁"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += ["▁" + w for w in _WORDS]
    tokens += pieces
    types += [TokenType.NORMAL] * len(pieces)
    # higher score = merged earlier; whole words beat letters
    scores = [0.0] * (5 + 256) + [-float(i) for i in range(len(pieces), 0, -1)]
    return tokens, scores, [int(t) for t in types]


def _bpe_vocab() -> tuple[list[str], list[int], list[str]]:
    from gguf import TokenType

    byte_chars = list(_bytes_to_unicode().values())
    tokens = list(byte_chars)
    types = [TokenType.NORMAL] * len(tokens)
    merges: list[str] = []
    space = _bytes_to_unicode()[ord(" ")]
    for word in _WORDS:
        # merge left to right: "Ġ t" -> "Ġt", "Ġt h" -> "Ġth", ...
        chars = [space, *word]
        acc = chars[0]
        for ch in chars[1:]:
            merged = acc + ch
            if merged not in tokens:
                merges.append(f"{acc} {ch}")
                tokens.append(merged)
                types.append(TokenType.NORMAL)
            acc = merged
    for special in ("<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"):
        tokens.append(special)
        types.append(TokenType.CONTROL)
    return tokens, [int(t) for t in types], merges


def _write_tokenizer(w: Any, tokenizer: Tokenizer) -> int:
    """Write the generated tokenizer and the chat template; the vocabulary size."""
    w.add_chat_template(CHAT_TEMPLATE)
    if tokenizer == "spm":
        tokens, scores, types = _spm_vocab()
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
    else:
        tokens, types, merges = _bpe_vocab()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(tokens.index("<|begin_of_text|>"))
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_add_bos_token(True)
    return len(tokens)


def _copy_tokenizer(w: Any, source: Path) -> int:
    """Copy every ``tokenizer.*`` key of ``source`` into ``w``; the vocabulary size."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        w.add_key_value(key, value, vtype, sub_type=sub)
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
    if "tokenizer.chat_template" not in reader.fields:
        w.add_chat_template(CHAT_TEMPLATE)
    if not n_vocab:
        raise ValueError(f"{source} has no token table (tokenizer.ggml.tokens) to copy")
    return n_vocab


def write_gguf(path: Path, spec: GgufSpec | None = None) -> Path:
    """Write a random-weight llama GGUF to ``path`` and return it."""
    import gguf

    spec = spec or GgufSpec()
    if spec.n_embd % 32 or spec.n_ff % 32 or spec.n_embd % spec.n_heads:
        raise ValueError("n_embd and n_ff must be multiples of 32 and n_embd divisible by n_heads")
    if spec.n_heads % spec.n_kv_heads:
        raise ValueError("n_heads must be a multiple of n_kv_heads")
    qtype = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
             "q4_0": gguf.GGMLQuantizationType.Q4_0}[spec.weight_type]
    ftype = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[spec.weight_type]
    rng = np.random.default_rng(spec.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"edgepilot-random-{spec.tokenizer}-{spec.weight_type}")
    w.add_block_count(spec.n_layers)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_heads)
    w.add_head_count_kv(spec.n_kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(spec.n_embd // spec.n_heads)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(ftype)
    if spec.pooling_type:
        w.add_pooling_type(gguf.PoolingType(spec.pooling_type))
    if spec.tokenizer_from is not None:
        n_vocab = _copy_tokenizer(w, spec.tokenizer_from)
    else:
        n_vocab = _write_tokenizer(w, spec.tokenizer)
    head_dim = spec.n_embd // spec.n_heads
    n_embd_kv = head_dim * spec.n_kv_heads

    def mat(name: str, rows: int, cols: int) -> None:
        # numpy shape is (rows, cols) = ggml ne [cols, rows]; quant blocks run along cols
        data = (rng.standard_normal((rows, cols)) * (1.0 / np.sqrt(cols))).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    def norm(name: str) -> None:
        w.add_tensor(name, np.ones(spec.n_embd, dtype=np.float32))

    mat("token_embd.weight", n_vocab, spec.n_embd)
    for i in range(spec.n_layers):
        norm(f"blk.{i}.attn_norm.weight")
        mat(f"blk.{i}.attn_q.weight", spec.n_embd, spec.n_embd)
        mat(f"blk.{i}.attn_k.weight", n_embd_kv, spec.n_embd)
        mat(f"blk.{i}.attn_v.weight", n_embd_kv, spec.n_embd)
        mat(f"blk.{i}.attn_output.weight", spec.n_embd, spec.n_embd)
        norm(f"blk.{i}.ffn_norm.weight")
        mat(f"blk.{i}.ffn_gate.weight", spec.n_ff, spec.n_embd)
        mat(f"blk.{i}.ffn_up.weight", spec.n_ff, spec.n_embd)
        mat(f"blk.{i}.ffn_down.weight", spec.n_embd, spec.n_ff)
    norm("output_norm.weight")
    mat("output.weight", n_vocab, spec.n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
