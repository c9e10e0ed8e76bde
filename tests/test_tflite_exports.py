"""TFLite files as exporters and vendors write them, beyond float and int8 tensors: a string
input (a vocabulary lookup), a custom op of a vendor's precompiled NPU file, a file the
interpreter aborts on. Planning takes the first like any input; the second exits 2 in one line,
and Arm NN never hands it to its native parser (which segfaulted the whole process on such a
file's DISPATCH_OP); the third is refused in one line (asked in a child process first) and the
daemon goes on serving."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from cli_proc import FAST_PLANNING
from cli_proc import run_cli as cli
from daemon_proc import DaemonProcess

from edgepilot.backends.armnn import ArmnnBackend
from edgepilot.backends.base import Segment, Target
from edgepilot.formats.io import tensor_specs
from edgepilot.formats.tflite_gen import write_mlp_tflite
from edgepilot.formats.tflite_traps import (
    write_computed_block_tflite,
    write_custom_op_tflite,
    write_hybrid_conv_tflite,
    write_string_gather_tflite,
    write_zero_scale_add_tflite,
)

CONFIG = FAST_PLANNING


def test_a_string_input_is_an_input_like_any_other(tmp_path: Path) -> None:
    path = write_string_gather_tflite(tmp_path / "lookup.tflite")
    ins, outs = tensor_specs(path, "tflite")
    assert [(s.name, s.dtype) for s in ins] == [("input", "object"), ("indices", "int32")]
    assert outs[0].dtype == "object"
    res = cli(tmp_path, "plan", str(path), "--json")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    plan = json.loads(res.stdout)
    assert plan["segments"] and plan["error"] == 0


def test_a_vendor_custom_op_exits_2_in_one_line_and_arm_nn_never_parses_it(
        tmp_path: Path) -> None:
    path = write_custom_op_tflite(tmp_path / "npu.tflite", op="DISPATCH_OP")
    support = ArmnnBackend().supports(Segment(path, "tflite", ("x",), ("y",)),
                                      Target("armnn", "CpuRef", "fp32"))
    assert not support and "takes no custom op DISPATCH_OP" in support.reason
    res = cli(tmp_path, "plan", str(path))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "npu.tflite" in lines[0] and "DISPATCH_OP" in lines[0]


def test_a_file_the_interpreter_crashes_on_is_refused_and_the_daemon_keeps_serving(
        tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    broken = write_zero_scale_add_tflite(models / "broken.tflite")
    write_mlp_tflite(models / "mlp.tflite", width=8, depth=2)
    # what a user of the raw runtime sees: the process itself dies
    raw = subprocess.run([sys.executable, "-c", "from ai_edge_litert.interpreter import "
                          f"Interpreter; Interpreter(model_path={str(broken)!r})"
                          ".allocate_tensors()"], capture_output=True, timeout=120, check=False)
    assert raw.returncode < 0
    res = cli(tmp_path, "plan", str(broken))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "broken.tflite" in lines[0] and "SIGABRT" in lines[0], lines
    d = DaemonProcess(tmp_path, CONFIG + f'[daemon]\nmodel_dir = "{models}"\n',
                      extra_args=["--model-dir", str(models)]).start(timeout=120)
    try:
        zeros = {"data": [0] * 4, "dtype": "int8", "shape": [1, 4]}
        code, err = d.request("POST", "/v1/infer/broken",
                              {"inputs": {"a": zeros, "b": zeros}}, timeout=120)
        assert code == 422, err
        assert "crashes preparing" in err["error"]["message"]
        x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
        code, ok = d.request("POST", "/v1/infer/mlp", {"inputs": {"input": {
            "data": x.ravel().tolist(), "dtype": "float32", "shape": [1, 8]}}}, timeout=120)
        assert code == 200, ok  # the daemon is still there, serving the other model
        assert np.asarray(ok["outputs"]["output"]["data"]).size == 8
    finally:
        d.stop()


def test_a_float_file_with_per_channel_int8_weights_plans_without_arm_nn_fp16(
        tmp_path: Path) -> None:
    # dynamic-range quantization's output: Arm NN asserts reducing it to fp16 (SIGABRT), so
    # the build is asked of a child first; before, `plan` and the daemon died with it
    path = write_hybrid_conv_tflite(tmp_path / "hybrid.tflite")
    segment = Segment(path, "tflite", ("x",), ("y",))
    support = ArmnnBackend().supports(segment, Target("armnn", "CpuRef", "fp16"))
    assert not support and "Arm NN crashes building hybrid.tflite" in support.reason
    assert "SIGABRT" in support.reason and "fp16" in support.reason
    res = cli(tmp_path, "plan", "--json", str(path))
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["error"] <= plan["tolerance"]
    assert all(s["target"].startswith("tflite/") for s in plan["segments"])
    assert "Traceback" not in res.stderr


def test_select_tensorflow_ops_are_named_and_no_shape_is_suggested(tmp_path: Path) -> None:
    # a Flex op in a dynamic-batch file: before, the line ended advising --input-shape, which
    # gave the same error
    path = write_custom_op_tflite(tmp_path / "lm.tflite", op="FlexSentencepieceOp",
                                  open_batch=True)
    assert tensor_specs(path, "tflite")[0][0].shape == (None, 8)
    res = cli(tmp_path, "plan", str(path))
    assert res.returncode == 2
    [line] = res.stderr.strip().splitlines()
    assert "lm.tflite" in line and "Select TensorFlow (Flex) ops" in line
    assert "--input-shape" not in line and "input shapes" not in line


def test_arm_nn_never_parses_an_operator_whose_parameters_are_computed(tmp_path: Path) -> None:
    # a dilated convolution's SPACE_TO_BATCH_ND takes its block shape from SHAPE upstream; a
    # cut hands it over as an input, and Arm NN's parser copied from the empty buffer and
    # segfaulted (the raw parser does, in a child here): the daemon died planning it
    path = write_computed_block_tflite(tmp_path / "dilated.tflite")
    raw = subprocess.run([sys.executable, "-c", "import pyarmnn as a; a.ITfLiteParser()"
                          f".CreateNetworkFromBinaryFile({str(path)!r})"],
                         capture_output=True, timeout=120, check=False)
    assert raw.returncode < 0
    segment = Segment(path, "tflite", ("x", "block", "pads"), ("y",))
    support = ArmnnBackend().supports(segment, Target("armnn", "CpuRef", "fp32"))
    assert not support and "SPACE_TO_BATCH_ND input 1" in support.reason
    assert "SPACE_TO_BATCH_ND input 2" in support.reason
    # planning survives it too: generated block shapes hold 0s, which LiteRT refuses, so it
    # ends in one line asking for real samples (not a dead process)
    res = cli(tmp_path, "plan", str(path))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "calibration_dir" in res.stderr
