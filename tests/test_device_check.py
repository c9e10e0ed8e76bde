"""scripts/device-check.sh on a machine without a CUDA device (this one, and CI): it says so
clearly, writes its JSON saying so, installs nothing and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.executable).parent.parent  # the venv running the tests (make install's)


def test_without_cuda_it_says_so_and_exits_0(tmp_path: Path) -> None:
    # a PATH holding only the basic tools: no nvidia-smi, whatever this machine has
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("mkdir", "dirname", "head", "printf"):
        for d in ("/usr/bin", "/bin"):
            if Path(d, tool).exists():
                os.symlink(Path(d, tool), bindir / tool)
                break
    out = tmp_path / "out"
    res = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "device-check.sh"), str(out),
                          str(tmp_path / "no-venv")], capture_output=True, text=True,
                         timeout=60, check=False, env={"PATH": str(bindir)})
    assert res.returncode == 0, res.stderr
    assert "no CUDA device present" in res.stdout
    report = json.loads((out / "device-check.json").read_text())
    assert report["cuda"] is False and "no CUDA device" in report["reason"]
    # nothing was installed or planned
    assert sorted(p.name for p in out.iterdir()) == ["device-check.json"]


def _fake_gpu_path(tmp_path: Path) -> str:
    """PATH with an ``nvidia-smi`` that names a GPU: the script's CUDA path, run on this CPU."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "Test GPU, 1 MiB, 0.0"\n')
    smi.chmod(0o755)
    return f"{bindir}:{os.environ['PATH']}"


def test_with_a_gpu_it_plans_benches_and_summarises_each_model(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PATH": _fake_gpu_path(tmp_path), "DEVICE_CHECK_INSTALL": "0",
           "DEVICE_CHECK_MODELS": "silero-vad", "DEVICE_CHECK_RUNS": "2",
           "DEVICE_CHECK_GGUF": "none"}
    res = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "device-check.sh"), str(out),
                          str(VENV)], capture_output=True, text=True, timeout=600,
                         check=False, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "CUDA device: Test GPU" in res.stdout
    report = json.loads((out / "device-check.json").read_text())
    assert report["cuda"] is True and report["failed"] == []
    assert "onnxruntime/cpu/fp32 PASS" in report["targets"]
    [row] = report["models"]
    assert row["model"] == "silero-vad" and row["plan_targets"]
    assert row["plan_ms"] > 0 and row["best_single"] in row["single_ms"]
    assert row["planning_s"] is not None and row["raw_ms"] > 0


def test_an_unknown_model_name_is_refused_with_the_allowed_ones(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _fake_gpu_path(tmp_path), "DEVICE_CHECK_INSTALL": "0",
           "DEVICE_CHECK_MODELS": "no-such-model"}
    res = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "device-check.sh"),
                          str(tmp_path / "out"), str(VENV)], capture_output=True,
                         text=True, timeout=300, check=False, env=env, cwd=ROOT)
    assert res.returncode == 2
    # refused before anything was installed or run
    assert not (tmp_path / "out" / "doctor.json").exists()
    assert "DEVICE_CHECK_MODELS: unknown ['no-such-model']" in res.stderr
    assert "silero-vad" in res.stderr


def test_a_gguf_is_planned_and_timed_raw_beside_its_plan(tmp_path: Path) -> None:
    from edgepilot.formats.gguf_gen import GgufSpec, write_gguf

    gguf = write_gguf(tmp_path / "tiny.gguf", GgufSpec())
    out = tmp_path / "out"
    env = {**os.environ, "PATH": _fake_gpu_path(tmp_path), "DEVICE_CHECK_INSTALL": "0",
           "DEVICE_CHECK_MODELS": "none", "DEVICE_CHECK_GGUF": str(gguf)}
    res = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "device-check.sh"), str(out),
                          str(VENV)], capture_output=True, text=True, timeout=600,
                         check=False, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((out / "device-check.json").read_text())
    assert report["failed"] == [] and report["models"] == []
    row = report["gguf"]
    # this llama.cpp build has no GPU backend: every block on the CPU, both in the plan and raw
    assert row["n_gpu_layers"] == 0 and row["decode_tokens_per_s"] > 0
    assert "no GPU backend" in row["note"] and row["planning_s"] >= 0
    [raw] = row["raw"]
    assert raw["n_gpu_layers"] == 0 and raw["decode_ms_per_token"] > 0 and raw["n_threads"] >= 1


def test_a_missing_gguf_is_a_named_failure(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PATH": _fake_gpu_path(tmp_path), "DEVICE_CHECK_INSTALL": "0",
           "DEVICE_CHECK_MODELS": "none", "DEVICE_CHECK_GGUF": str(tmp_path / "gone.gguf")}
    res = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "device-check.sh"), str(out),
                          str(VENV)], capture_output=True, text=True, timeout=300,
                         check=False, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((out / "device-check.json").read_text())
    assert report["failed"] == [f"gguf: no such file: {tmp_path / 'gone.gguf'}"]
    assert report["gguf"] is None
