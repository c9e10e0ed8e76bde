"""What a new user sees on stderr: no native runtime chatter from ``doctor`` or ``plan``, and a
real llama.cpp warning arriving as a log record (named, levelled), not raw on fd 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from edgepilot.formats.gguf_gen import GgufSpec, write_gguf
from edgepilot.formats.onnx_gen import mlp_stack

QUIET = """
[mqtt]
enabled = false
[daemon]
demo_models = false
[dispatch]
kernel_corpus = false
profile_runs = 3
warmup_runs = 1
targets = ["onnxruntime/cpu/fp32", "onnxruntime/cpu/int8", "onnxruntime/cpu/int4"]
"""
NOISE = ("XNNPACK delegate", "n_ctx_train", "Quantization parameters", "Ignore MatMul",
         "gguf_writer", "llama_context")


def edgepilot(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp / "edgepilot.toml"
    cfg.write_text(QUIET)
    return subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir", str(tmp / "st"),
         "--model-dir", str(tmp / "models"), *args],
        capture_output=True, text=True, timeout=240, check=False)


def test_doctor_stderr_is_empty(tmp_path: Path) -> None:
    res = edgepilot(tmp_path, "doctor")
    # every runtime was probed (so each had its chance to print)
    for line in ("PASS onnxruntime/cpu/fp32", "PASS tflite/xnnpack/fp32",
                 "PASS llamacpp/cpu/native"):
        assert line in res.stdout, res.stdout
    assert res.stderr == "", res.stderr


def test_planning_logs_no_quantizer_advice(tmp_path: Path) -> None:
    mlp_stack(tmp_path / "models" / "mlp.onnx", widths=(32, 64, 64, 32), batch=2)
    res = edgepilot(tmp_path, "--log-level", "info", "plan", "mlp")
    assert res.returncode == 0, res.stderr
    assert "onnxruntime/cpu/int8" in res.stdout  # the int8 quantizer ran for this plan
    noisy = [ln for ln in res.stderr.splitlines() if any(n in ln for n in NOISE)]
    assert noisy == [], noisy


def test_llama_warning_is_a_log_record_not_raw_stderr(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "short.gguf", GgufSpec(n_ctx_train=512))
    script = f"""
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="LOG %(levelname)s %(name)s: %(message)s")
from pathlib import Path
from edgepilot.backends.llamacpp.backend import LlamaCppBackend
from edgepilot.config import LlamacppSection
LlamaCppBackend(LlamacppSection(n_ctx=2048)).open(Path({str(path)!r}))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    # served past its trained context: llama.cpp's warning, through logging at WARNING
    assert any(ln.startswith("LOG WARNING llama.cpp: ") and "n_ctx_train (512)" in ln
               for ln in lines), lines
    # nothing else of llama.cpp's reaches stderr at INFO, and nothing raw at all
    assert all(ln.startswith("LOG ") for ln in lines), lines
    assert not any(ln.startswith("LOG DEBUG") for ln in lines)
