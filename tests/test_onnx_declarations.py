"""ONNX files that declare less than most, or more than a runtime here has: an input with a type
and no shape at all (not even its rank), an output declared by name alone (both legal ONNX that
onnxruntime runs: ``plan`` asks for what it must know in one line and plans the rest), and an
operator of a custom-op library (refused in one line naming it, before any question of shapes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from cli_proc import run_cli as cli
from onnx import TensorProto, helper

from edgepilot.formats.io import tensor_specs


def _relu_model(path: Path, x: onnx.ValueInfoProto, y: onnx.ValueInfoProto) -> Path:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]),
                               helper.make_node("Mul", ["h", "two"], ["y"])],
                              "g", [x], [y],
                              [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_an_input_of_unknown_rank_asks_for_its_shape_and_takes_any_rank(tmp_path: Path) -> None:
    path = _relu_model(tmp_path / "norank.onnx",
                       helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                       helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    [x], _ = tensor_specs(path, "onnx")
    assert not x.rank_known and x.dtype == "float32"
    res = cli(tmp_path, "plan", str(path))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "'x' declares no shape" in lines[0] and "--input-shape" in lines[0]
    # before: the missing shape read as a scalar, and the right shape was refused as 4 dims
    res = cli(tmp_path, "plan", "--json", "--input-shape", "x=1x4x4x2", str(path))
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["input_shapes"] == {"x": [1, 4, 4, 2]} and plan["error"] == 0


def test_an_output_declared_by_name_alone_gets_its_type_from_shape_inference(
        tmp_path: Path) -> None:
    path = _relu_model(tmp_path / "untyped.onnx",
                       helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                       onnx.ValueInfoProto(name="y"))
    raw = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert raw.run(None, {"x": np.ones((2, 3), np.float32)})[0].shape == (2, 3)
    _, [y] = tensor_specs(path, "onnx")
    assert (y.name, y.dtype, y.shape) == ("y", "float32", (2, 3))
    res = cli(tmp_path, "plan", "--json", str(path))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["error"] == 0


def test_a_custom_op_librarys_operator_is_named_before_any_shape_is_asked(
        tmp_path: Path) -> None:
    # onnxruntime-extensions' tokenizer: a string input of open length, an op no schema here has
    node = helper.make_node("BertTokenizer", ["text"], ["ids"], domain="ai.onnx.contrib")
    graph = helper.make_graph([node], "tok",
                              [helper.make_tensor_value_info("text", TensorProto.STRING, ["n"])],
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["m"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.contrib", 1)])
    path = tmp_path / "tok.onnx"
    onnx.save(model, str(path))
    res = cli(tmp_path, "plan", str(path))
    assert res.returncode == 2
    [line] = res.stderr.strip().splitlines()
    assert "tok.onnx" in line and "ai.onnx.contrib:BertTokenizer" in line
    assert "--input-shape" not in line  # before: asked for a shape that could not help
    # given a shape anyway: one line, the reason once for every target that gave it
    res = cli(tmp_path, "plan", "--input-shape", "text=1", str(path))
    assert res.returncode == 2
    [line] = res.stderr.strip().splitlines()
    assert line.count("BertTokenizer") == 1 and "onnxruntime/cpu-1t/fp32" in line


def test_a_segment_that_does_not_build_on_its_target_goes_to_the_reference(
        tmp_path: Path) -> None:
    """A classic-ML graph (``ai.onnx.ml`` alone): each layer's int8 variant builds and times
    fast, the merged segment's does not (the quantizer finds no ai.onnx domain). Before, the
    plan that merged them ended planning ("could not make the int8-dynamic variant") and the
    model was never planned; now those layers go back to the reference."""
    ins = [helper.make_tensor_value_info(f"i{k}", TensorProto.FLOAT, [1, 1]) for k in range(4)]
    nodes = [helper.make_node("Scaler", ["i0"], ["s0"], domain="ai.onnx.ml", offset=[0.5],
                              scale=[2.0]),
             helper.make_node("FeatureVectorizer", ["s0", "i1", "i2", "i3"], ["fv"],
                              domain="ai.onnx.ml", inputdimensions=[1, 1, 1, 1]),
             helper.make_node("Scaler", ["fv"], ["y"], domain="ai.onnx.ml", offset=[0.1] * 4,
                              scale=[0.5] * 4)]
    graph = helper.make_graph(nodes, "ml", ins,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    path = tmp_path / "ml.onnx"
    onnx.save(model, str(path))
    config = ('[dispatch]\ntargets = ["onnxruntime/cpu/fp32", "onnxruntime/cpu/int8"]\n'
              "kernel_corpus = false\nprofile_runs = 3\n[mqtt]\nenabled = false\n")
    for run in range(3):  # which target wins a 10 µs layer moves with load: every way plans
        (tmp_path / str(run)).mkdir()
        res = cli(tmp_path / str(run), "plan", "--json", str(path), config=config)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["error"] <= 0.05
