"""`edgepilot plan|bench --input-shape` on real exported models with dynamic dims (subprocesses).

Where a dim cannot be known the CLI exits 2 with one line naming the input, the dim and where
to set it; with shapes given (flag or config) it plans, and plans are keyed by the signature.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from real_models import by_name

CONFIG = """
[dispatch]
profile_runs = 3
warmup_runs = 1
profile_passes = 1
kernel_corpus = false
targets = ["onnxruntime/cpu/fp32", "onnxruntime/cpu/int8"]
[mqtt]
enabled = false
"""


def cli(tmp: Path, *args: str, config: str = CONFIG) -> subprocess.CompletedProcess[str]:
    cfg = tmp / "edgepilot.toml"
    cfg.write_text(config)
    models = tmp / "models"
    models.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir", str(tmp / "st"),
         "--model-dir", str(models), *args],
        capture_output=True, text=True, timeout=300, check=False)


def test_a_dynamic_dim_without_a_shape_is_one_line_naming_input_dim_and_flag(
        tmp_path: Path) -> None:
    yolo = str(by_name("yolov8n").path)
    res = cli(tmp_path, "plan", yolo)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "'images' dims 0 ('batch'), 2 ('height'), 3 ('width') are dynamic" in lines[0]
    assert "--input-shape" in lines[0] and "input_shapes" in lines[0]
    # a shape that contradicts a dim the model fixes names both values
    res = cli(tmp_path, "plan", yolo, "--input-shape", "images=1x4x320x320")
    assert res.returncode == 2 and "fixed at 3" in res.stderr and "says 4" in res.stderr
    res = cli(tmp_path, "plan", yolo, "--input-shape", "img=1x3x320x320")
    assert res.returncode == 2 and "no input 'img'" in res.stderr and "images" in res.stderr
    res = cli(tmp_path, "plan", yolo, "--input-shape", "images=1x3xbig")
    assert res.returncode == 2
    assert "--input-shape" in res.stderr and "positive integers" in res.stderr


def test_plans_are_keyed_by_the_input_shape_signature(tmp_path: Path) -> None:
    src = by_name("ppocr-rec").path
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "rec.onnx").write_bytes(src.read_bytes())
    wide = cli(tmp_path, "plan", "rec", "--json", "--input-shape", "x=1x3x48x320")
    assert wide.returncode == 0, wide.stderr
    narrow = cli(tmp_path, "plan", "rec", "--json", "--input-shape", "x=1x3x48x160")
    assert narrow.returncode == 0, narrow.stderr
    a, b = json.loads(wide.stdout), json.loads(narrow.stdout)
    assert a["input_shapes"] == {"x": [1, 3, 48, 320]} and a["signature"] == "x=1x3x48x320"
    assert b["input_shapes"] == {"x": [1, 3, 48, 160]}
    assert a["hash"] != b["hash"]
    assert a["inputs_used"]["source"] == "generated"
    assert a["inputs_used"]["inputs"]["x"] == "uniform in [0, 1)"
    # the config's input_shapes serve when no flag is given (and the cache answers at once)
    entry = '[[models]]\nname = "rec"\nfile = "rec.onnx"\ninput_shapes = { x = [1, 3, 48, 160] }\n'
    res = cli(tmp_path, "plan", "rec", "--json", config=CONFIG + entry)
    assert res.returncode == 0, res.stderr
    again = json.loads(res.stdout)
    assert again["signature"] == "x=1x3x48x160" and again["hash"] == b["hash"]
    assert again["from_cache"] is True


def test_bench_takes_input_shapes_and_keeps_its_json_shape(tmp_path: Path) -> None:
    silero = str(by_name("silero-vad").path)
    res = cli(tmp_path, "bench", silero, "--json", "--runs", "3", "--budget-s", "0",
              "--input-shape", "input=1x512", "--input-shape", "state=2x1x128")
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert set(result) >= {"model", "hash", "plan", "single", "raw", "paired_ratio",
                           "speedup_vs_best_single", "predicted_vs_measured"}
    assert "onnxruntime/cpu/fp32" in result["single"]
    # the CPU a run took next to its wall time, for every variant and for the plan's
    # profiled whole model (a one-target plan: its prediction), so predicted/measured can be
    # split into the work and the parallelism the cores allowed
    assert result["plan"]["cpu_ms"] > 0
    assert all(v["cpu_ms"] > 0 for v in result["single"].values())
    if len(result["plan"]["targets"]) == 1:
        cpu = result["cpu"]
        assert cpu["profiled_ms"] > 0 and cpu["measured_ms"] == result["plan"]["cpu_ms"]
        assert cpu["parallelism_measured"] == round(cpu["measured_ms"]
                                                    / result["plan"]["median_ms"], 2)
    # the file as given is the reference: its own single target has no error at all
    assert result["single"]["onnxruntime/cpu/fp32"]["error"] == 0.0
