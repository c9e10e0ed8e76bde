"""ONNX files as they come: weights in an external-data file, opsets 11 to 21, a symbolic
batch. Each is partitioned for concrete shapes and its segments, chained on onnxruntime,
reproduce the whole model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.graph.partition import partition

FP32 = Target("onnxruntime", "cpu", "fp32")


def conv_mlp(opset: int) -> onnx.ModelProto:
    """Conv -> Relu -> Flatten -> MatMul -> Relu -> MatMul, symbolic batch, no value_info.

    Only operators whose signature is the same from opset 11 to 21, so one graph serves all.
    """
    rng = np.random.default_rng(opset)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8 * 16 * 16, 64)).astype(np.float32) / 40,
                                 "w2")
    w3 = numpy_helper.from_array(rng.standard_normal((64, 10)).astype(np.float32) / 8, "w3")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu0"),
        helper.make_node("Flatten", ["r"], ["f"], axis=1, name="flat"),
        helper.make_node("MatMul", ["f", "w2"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["hr"], name="relu1"),
        helper.make_node("MatMul", ["hr", "w3"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes, "conv_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        initializer=[w1, w2, w3])
    ir = 7 if opset <= 12 else 10
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ir)


def chain_matches_whole(path: Path, tmp: Path, batch: int) -> int:
    part = partition(path, shapes={"x": (batch, 3, 16, 16)}, cache_dir=tmp / "graphs",
                     min_layer_flops=1)
    backend = OnnxRuntimeBackend()
    x = np.random.default_rng(0).standard_normal((batch, 3, 16, 16)).astype(np.float32)
    env = {"x": x}
    for i in range(len(part.layers)):
        env.update(backend.compile(part.segment(i, i + 1), FP32).run(env))
    whole = backend.compile(part.segment(0, len(part.layers)), FP32).run({"x": x})
    np.testing.assert_allclose(env["y"], whole["y"], rtol=1e-4, atol=1e-4)
    return len(part.layers)


@pytest.mark.parametrize("opset", [11, 13, 17, 21])
def test_opsets_11_to_21_partition_and_chain(tmp_path: Path, opset: int) -> None:
    path = tmp_path / f"m{opset}.onnx"
    onnx.save(conv_mlp(opset), str(path))
    assert chain_matches_whole(path, tmp_path, batch=2) >= 3


def test_weights_in_an_external_data_file(tmp_path: Path) -> None:
    src = tmp_path / "ext"
    src.mkdir()
    path = src / "model.onnx"
    onnx.save(conv_mlp(17), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.weights", size_threshold=0)
    # the weights really live beside the graph, not in it
    assert (src / "model.weights").stat().st_size > path.stat().st_size
    assert chain_matches_whole(path, tmp_path, batch=3) >= 3
