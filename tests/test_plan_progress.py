"""Planning progress is visible: ``GET /v1/plan/{model}`` answers 202 with how far the plan is
while it is made in the background (never a silent wait), 200 with the plan once it exists; the
CLI draws its bar on a terminal (forced here through EDGEPILOT_PROGRESS) and not into a pipe."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProcess

from edgepilot.config import load_config
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.formats.onnx_gen import mlp_stack

CONFIG = """
[mqtt]
enabled = false
[daemon]
demo_models = false
[dispatch]
kernel_corpus = false
profile_runs = 3
warmup_runs = 1
targets = ["onnxruntime/cpu/fp32", "onnxruntime/cpu/int8"]
"""
PROGRESS_KEYS = {"state", "model", "signature", "done", "total", "what"}


def model_dir(tmp: Path) -> Path:
    models = tmp / "models"
    models.mkdir(parents=True, exist_ok=True)
    mlp_stack(models / "mlp.onnx", widths=(32, 64, 64, 32), batch=2)
    return models


def start(tmp: Path, factory: Any) -> DaemonProcess:
    models = model_dir(tmp)
    cfg = CONFIG.replace("[daemon]\n", f'[daemon]\nmodel_dir = "{models}"\n')
    d: DaemonProcess = factory(cfg).start()
    return d


def check_progress(body: dict[str, Any]) -> None:
    assert set(body) == PROGRESS_KEYS, body
    assert body["state"] == "planning" and body["model"] == "mlp"
    assert body["signature"] == "x=2x32"
    assert body["done"] >= 0 and (body["total"] == 0 or body["done"] <= body["total"]), body
    assert isinstance(body["what"], str) and body["what"]


def test_plan_route_answers_202_with_progress_then_200_with_the_plan(
        tmp_path: Path, daemon_factory: Any) -> None:
    d = start(tmp_path, daemon_factory)
    try:
        # nothing planned yet: the first ask starts planning and answers at once
        with urllib.request.urlopen(d.url + "/v1/plan/mlp", timeout=30) as resp:
            assert resp.status == 202
            assert resp.headers["Retry-After"] == "1"
            check_progress(json.loads(resp.read()))
        deadline = time.monotonic() + 240
        while True:
            code, body = d.request("GET", "/v1/plan/mlp")
            if code == 200:
                break
            assert code == 202, body
            check_progress(body)
            assert time.monotonic() < deadline, d.output()
            time.sleep(0.2)
        assert body["model"] == "mlp" and body["signature"] == "x=2x32" and body["layers"]
        # one plan, whichever way it is asked for
        code, waited = d.request("GET", "/v1/plan/mlp?wait=true")
        assert code == 200 and waited["hash"] == body["hash"]
        code, reply = d.request("POST", "/v1/commands/plan.get", {"model": "mlp"})
        assert code == 200 and reply["result"]["hash"] == body["hash"]
        # the plan serves requests of its shapes
        x = {"x": {"data": [0.5] * 64, "dtype": "float32", "shape": [2, 32]}}
        code, out = d.request("POST", "/v1/infer/mlp", {"inputs": x})
        assert code == 200 and out["plan"] == body["hash"], out
        assert "planning mlp in the background" in d.output()
        # an unknown model is still a 404 naming the field, not a 202
        code, err = d.request("GET", "/v1/plan/nope")
        assert code == 404 and err["error"]["field"] == "model"
        code, err = d.request("GET", "/v1/plan/nope?wait=true")
        assert code == 404
    finally:
        assert d.stop() == 0


def test_plan_route_waits_when_asked(tmp_path: Path, daemon_factory: Any) -> None:
    d = start(tmp_path, daemon_factory)
    try:
        code, plan = d.request("GET", "/v1/plan/mlp?wait=true", timeout=240)
        assert code == 200 and plan["signature"] == "x=2x32", plan
        code, again = d.request("GET", "/v1/plan/mlp")
        assert code == 200 and again["hash"] == plan["hash"]
    finally:
        assert d.stop() == 0


def test_progress_is_recorded_per_model_and_signature(tmp_path: Path) -> None:
    models = model_dir(tmp_path)
    cfg = tmp_path / "edgepilot.toml"
    cfg.write_text(CONFIG)
    conf = load_config(cfg, {"state_dir": tmp_path / "st", "model_dir": models})
    calls: list[tuple[int, int, str]] = []
    recorded: list[tuple[int, int, str] | None] = []

    def bar(done: int, total: int, what: str) -> None:
        calls.append((done, total, what))
        recorded.append(dispatcher.background.progress.get(("mlp", "x=2x32")))

    dispatcher = Dispatcher(conf, progress=bar)
    dispatcher.get("mlp").prepare()
    assert calls, "profiling reported no progress"
    # what the CLI's bar is shown is what GET /v1/plan answers with, for this model's key
    assert recorded == calls
    assert calls[-1][0] == calls[-1][1]


def run_plan(tmp: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """``edgepilot plan mlp`` (or ``args``): (exit code, stdout, stderr), carriage returns
    kept."""
    models = model_dir(tmp)
    cfg = tmp / "edgepilot.toml"
    cfg.write_text(CONFIG)
    res = subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir",
         str(tmp / "st"), "--model-dir", str(models), *(args or ("plan", "mlp"))],
        capture_output=True, timeout=240, check=False, env={**os.environ, **env})
    return res.returncode, res.stdout.decode(), res.stderr.decode()


def test_cli_plan_draws_its_bar_on_a_terminal_only(tmp_path: Path) -> None:
    rc, out, err = run_plan(tmp_path / "a", {"EDGEPILOT_PROGRESS": "1"})
    assert rc == 0, err
    bars = [seg for seg in err.split("\r") if seg.startswith("[")]
    assert bars, err
    # a phase ends on a full bar that closes its line
    full = [seg for seg in bars if re.match(r"\[#{30}\] (\d+)/\1 .*\n", seg, re.S)]
    assert full, bars[-3:]
    assert out.startswith("model mlp")
    rc, out, err = run_plan(tmp_path / "b", {"EDGEPILOT_PROGRESS": ""})
    assert rc == 0, err
    assert "\r" not in err and "#" * 30 not in err
    assert out.startswith("model mlp")


def test_cli_bench_shows_its_rounds(tmp_path: Path) -> None:
    rc, out, err = run_plan(tmp_path, {"EDGEPILOT_PROGRESS": "1"}, "bench", "mlp", "--runs", "3",
                            "--budget-s", "0")
    assert rc == 0, err
    rounds = [seg for seg in err.split("\r") if "bench round" in seg]
    assert [int(re.search(r"\] (\d+)/", seg).group(1)) for seg in rounds] == [1, 2, 3]  # type: ignore[union-attr]
    assert re.search(r"\[#{30}\] 3/3 bench: 3 rounds", err), err[-300:]
    assert out.startswith("model mlp")
