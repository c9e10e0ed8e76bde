"""Tensor-model memory estimates: model bytes + packed weights + peak activations from shapes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from models_fixtures import make_daemon

from edgepilot.errors import ModelError
from edgepilot.formats.memory import peak_live_bytes, tensor_memory
from edgepilot.formats.onnx_gen import mlp_stack, small_cnn
from edgepilot.formats.tflite_gen import write_mlp_tflite
from edgepilot.serving.registry import ModelTooLarge

F32 = 4


@pytest.mark.parametrize("batch", [1, 4])
def test_tflite_mlp_weights_and_peak_activations(tmp_path: Path, batch: int) -> None:
    path = write_mlp_tflite(tmp_path / "mlp.tflite", width=32, depth=3, batch=batch)
    mem = tensor_memory(path, "tflite")
    assert mem.file_bytes == path.stat().st_size
    assert mem.weight_bytes == 3 * (32 * 32 + 32) * F32
    # fc0 is kept for the residual ADD, so while fc2 runs fc0, fc1 and fc2 are all alive
    assert mem.activation_bytes == 3 * batch * 32 * F32
    assert mem.total_bytes == mem.file_bytes + mem.weight_bytes + mem.activation_bytes


def test_onnx_mlp_weights_and_peak_activations(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    mlp_stack(path, widths=(8, 16, 8), batch=2)
    mem = tensor_memory(path, "onnx")
    assert mem.weight_bytes == (8 * 16 + 16 + 16 * 8 + 8) * F32
    # the widest step: MatMul's [2,16] result and the Add's [2,16] output
    assert mem.activation_bytes == 2 * (2 * 16 * F32)


def test_activations_dominate_a_cnn_and_the_budget_sees_them(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    path = models / "cnn.onnx"
    small_cnn(path, size=256, channels=(8, 8), classes=2)
    mem = tensor_memory(path, "onnx")
    conv0 = 8 * 256 * 256 * F32  # Conv output and its Relu are alive together
    assert mem.activation_bytes == 2 * conv0
    # "twice the file" would have been under a quarter of what the first stage alone needs
    assert 2 * path.stat().st_size < mem.activation_bytes / 4
    d = make_daemon(tmp_path, backends={"memory_budget_mb": 2},
                    models=[{"name": "cnn", "file": "cnn.onnx"}])
    with pytest.raises(ModelTooLarge) as err:
        asyncio.run(d.models.load("cnn"))
    assert "peak activations 4.0 MiB" in err.value.message
    assert "budget is 2.0 MiB" in err.value.message
    ok = make_daemon(tmp_path, backends={"memory_budget_mb": 16},
                     models=[{"name": "cnn", "file": "cnn.onnx"}])
    lm = asyncio.run(ok.models.load("cnn"))
    assert lm.memory_bytes >= mem.total_bytes


def test_peak_live_bytes_keeps_skip_tensors_alive() -> None:
    sizes = {"x": 10, "a": 100, "b": 1, "c": 1, "y": 5}
    # a is read again by the last op: it stays alive across b and c
    ops: list[Any] = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["c"]), (["c", "a"], ["y"])]
    assert peak_live_bytes(ops, ["x"], ["y"], sizes) == 110  # x and a while the first op runs
    assert peak_live_bytes(ops[1:], ["a"], ["y"], {**sizes, "b": 50}) == 151  # a, b, c


def test_unknown_kinds_and_broken_files_are_model_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all")
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        tensor_memory(bad, "onnx")
    with pytest.raises(ModelError, match="kinds: onnx, tflite"):
        tensor_memory(bad, "gguf")
