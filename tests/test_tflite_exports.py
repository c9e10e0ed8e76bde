"""TFLite files as exporters and vendors write them, beyond float and int8 tensors: a string
input (a vocabulary lookup) and a custom op of a vendor's precompiled NPU file. Planning takes
the first like any input; the second exits 2 in one line, and Arm NN never hands it to its
native parser (which segfaulted the whole process on such a file's DISPATCH_OP)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from edgepilot.backends.armnn import ArmnnBackend
from edgepilot.backends.base import Segment, Target
from edgepilot.formats.io import tensor_specs
from edgepilot.formats.tflite_gen import write_custom_op_tflite, write_string_gather_tflite

CONFIG = """
[dispatch]
profile_runs = 3
warmup_runs = 1
profile_passes = 1
calibration_inputs = 1
kernel_corpus = false
[mqtt]
enabled = false
"""


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp / "edgepilot.toml"
    cfg.write_text(CONFIG)
    return subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir", str(tmp / "st"),
         *args], capture_output=True, text=True, timeout=600, check=False)


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
