"""The GGUF header reader against gguf.GGUFReader: same values, without the token table.

On the generated tiny GGUFs (both tokenizers), a big-endian file, and the real SmolLM2 instruct
model; then truncated and corrupt files, which must be a ModelError naming the file.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from models_fixtures import smollm2_gguf

from edgepilot.errors import ModelError
from edgepilot.formats import gguf_info
from edgepilot.formats.gguf_gen import GgufSpec, write_gguf
from edgepilot.formats.gguf_header import read_header
from edgepilot.formats.gguf_info import read_gguf_info


def reader_fields(reader: gguf.GGUFReader) -> dict[str, Any]:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def reader_info(path: Path) -> dict[str, Any]:
    """GgufInfo's values computed the slow way, with gguf.GGUFReader (the former reader)."""
    r = gguf.GGUFReader(str(path))
    f = reader_fields(r)
    arch = f["general.architecture"]
    heads = f[f"{arch}.attention.head_count"]
    kinds = Counter(t.tensor_type.name.lower() for t in r.tensors if len(t.shape) >= 2)
    return {"arch": arch, "n_layers": f[f"{arch}.block_count"],
            "n_embd": f[f"{arch}.embedding_length"], "n_heads": heads,
            "n_kv_heads": f.get(f"{arch}.attention.head_count_kv", heads),
            "head_dim": f.get(f"{arch}.attention.key_length",
                              f[f"{arch}.embedding_length"] // heads),
            "n_ctx_train": f.get(f"{arch}.context_length", 0),
            "weights_bytes": sum(int(t.n_bytes) for t in r.tensors),
            "block_bytes": sum(int(t.n_bytes) for t in r.tensors if t.name.startswith("blk.")),
            "weight_type": kinds.most_common(1)[0][0],
            "chat_template": f.get("tokenizer.chat_template")}


def same_as_reader(path: Path) -> None:
    r = gguf.GGUFReader(str(path))
    everything = read_header(path, lambda key: True)
    assert everything.fields == reader_fields(r)
    assert everything.data_offset == r.data_offset
    assert [(t.name, t.dims, t.type_name, t.n_bytes, everything.data_offset + t.offset)
            for t in everything.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), t.tensor_type.name.lower(), int(t.n_bytes),
         int(t.data_offset)) for t in r.tensors]
    info = read_gguf_info(path)
    assert {k: getattr(info, k) for k in reader_info(path)} == reader_info(path)


@pytest.mark.parametrize("tokenizer", ["spm", "bpe"])
def test_generated_gguf_reads_as_gguf_reader_reads_it(tmp_path: Path, tokenizer: str) -> None:
    path = write_gguf(tmp_path / "m.gguf", GgufSpec(tokenizer=tokenizer))  # type: ignore[arg-type]
    same_as_reader(path)


def test_big_endian_gguf_reads_as_gguf_reader_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_head_count(4)
    w.add_token_list(["a", "bb", "ccc"])
    w.add_token_scores([0.5, -1.0, 2.0])
    w.add_chat_template("{{ messages }}")
    w.add_tensor("blk.0.attn_q.weight", np.arange(32 * 32, dtype=np.float32).reshape(32, 32))
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    same_as_reader(path)


def test_real_instruct_gguf_reads_as_gguf_reader_reads_it() -> None:
    path = smollm2_gguf()
    same_as_reader(path)
    info = read_gguf_info(path)
    assert (info.arch, info.n_layers, info.weight_type) == ("llama", 30, "q4_1")
    assert info.chat_template and "<|im_start|>" in info.chat_template


def test_the_token_table_is_stepped_over_unless_asked_for() -> None:
    path = smollm2_gguf()
    header = read_header(path, gguf_info._wanted)
    assert "tokenizer.ggml.tokens" not in header.fields
    assert "tokenizer.ggml.merges" not in header.fields
    assert "tokenizer.chat_template" in header.fields
    tokens = read_header(path, {"tokenizer.ggml.tokens"}).fields["tokenizer.ggml.tokens"]
    r = gguf.GGUFReader(str(path))
    assert tokens == r.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == 49152


def test_info_is_parsed_once_per_file_version(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", GgufSpec(n_layers=2))
    assert read_gguf_info(path) is read_gguf_info(path)
    write_gguf(path, GgufSpec(n_layers=3))  # a new file at the same path is read again
    assert read_gguf_info(path).n_layers == 3


# ---- damaged files ----------------------------------------------------------------------------
def cut(src: Path, dst: Path, n: int) -> Path:
    dst.write_bytes(src.read_bytes()[:n])
    return dst


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("hdr") / "tiny.gguf", GgufSpec())


@pytest.mark.parametrize("where", ["keys", "token table", "tensor infos", "tensor data"])
def test_truncated_file_is_a_model_error_naming_it(tmp_path: Path, tiny: Path,
                                                   where: str) -> None:
    header = read_header(tiny, lambda key: True)
    n = {"keys": 40, "token table": 2000, "tensor infos": header.data_offset - 20,
         "tensor data": tiny.stat().st_size - 100}[where]
    path = cut(tiny, tmp_path / "cut.gguf", n)
    with pytest.raises(ModelError, match=r"cut\.gguf is a truncated or corrupt GGUF file") as err:
        read_gguf_info(path)
    assert err.value.field == "file"


def test_not_a_gguf_and_unknown_versions_are_named(tmp_path: Path, tiny: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match=r"empty\.gguf is not a GGUF file: 0 bytes"):
        read_gguf_info(empty)
    onnx = tmp_path / "model.gguf"
    onnx.write_bytes(b"\x08\x07\x12\x04" + bytes(100))
    with pytest.raises(ModelError, match=r"model\.gguf is not a GGUF file \(it starts with"):
        read_gguf_info(onnx)
    data = bytearray(tiny.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    future = tmp_path / "future.gguf"
    future.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"future\.gguf is GGUF version 99; supported: 2, 3"):
        read_gguf_info(future)


def test_corrupt_counts_and_types_are_model_errors(tmp_path: Path, tiny: Path) -> None:
    data = bytearray(tiny.read_bytes())
    huge = bytearray(data)
    huge[16:24] = (1 << 40).to_bytes(8, "little")  # n_kv far beyond the file
    path = tmp_path / "huge.gguf"
    path.write_bytes(bytes(huge))
    with pytest.raises(ModelError, match=r"huge\.gguf is a truncated or corrupt GGUF file: "
                                         r"it claims \d+ tensors and \d+ keys"):
        read_gguf_info(path)
    # the first key's value type (after u64 length + key bytes) set to an unknown type
    klen = int.from_bytes(data[24:32], "little")
    bad = bytearray(data)
    bad[32 + klen:36 + klen] = (77).to_bytes(4, "little")
    path = tmp_path / "badtype.gguf"
    path.write_bytes(bytes(bad))
    with pytest.raises(ModelError, match=r"badtype\.gguf .*unknown value type 77"):
        read_gguf_info(path)
