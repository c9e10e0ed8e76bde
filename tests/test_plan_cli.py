"""`edgepilot plan` / `edgepilot bench` as real subprocesses, and the plan over HTTP + commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgepilot.formats import onnx_gen

PLAN_KEYS = {"model", "hash", "predicted_ms", "measured_ms", "layers"}
LAYER_KEYS = {"name", "target", "predicted_ms", "measured_ms", "runner_up"}
CONFIG = """
[dispatch]
profile_runs = 3
warmup_runs = 1
targets = ["onnxruntime/cpu/fp32", "onnxruntime/cpu/int8", "onnxruntime/cpu/int4",
           "onnxruntime/cpu-1t/fp32"]
[mqtt]
enabled = false
"""


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp / "edgepilot.toml"
    cfg.write_text(CONFIG)
    return subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir", str(tmp / "st"),
         "--model-dir", str(tmp / "models"), *args],
        capture_output=True, text=True, timeout=240, check=False)


def models(tmp: Path) -> None:
    onnx_gen.transformer_stack(tmp / "models" / "tf.onnx", n_blocks=2, d_model=64, seq=16,
                               ffn_small=32, ffn_large=256)


def check_plan_shape(plan: dict[str, Any]) -> None:
    assert set(plan) >= PLAN_KEYS
    assert len(plan["hash"]) == 10
    for layer in plan["layers"]:
        assert set(layer) >= LAYER_KEYS
        assert layer["target"].startswith(("onnxruntime/cpu/", "onnxruntime/cpu-1t/"))
        ru = layer["runner_up"]
        assert ru is None or set(ru) == {"target", "predicted_ms"}


def rounding_slack(num_ms: float, den_ms: float) -> float:
    """How far a ratio of two times rounded to 4 decimals can sit from the ratio reported.

    The JSON rounds each time to 1e-4 ms and the ratio, computed from the unrounded times,
    to 1e-3: on a plan of some 0.05 ms (a CI machine's, this test's model) the times'
    rounding alone moved the ratio by 0.2%, past a fixed 2e-3.
    """
    half = 5e-5
    return (num_ms / den_ms) * (half / num_ms + half / den_ms) * 1.01 + 5e-4 + 1e-9


def test_plan_and_bench_cli(tmp_path: Path) -> None:
    models(tmp_path)
    first = cli(tmp_path, "plan", "tf", "--json")
    assert first.returncode == 0, first.stderr
    plan = json.loads(first.stdout)
    check_plan_shape(plan)
    assert plan["model"] == "tf" and not plan["from_cache"]
    assert list((tmp_path / "st" / "plans").glob("tf-*.json"))
    # the first plan on a board does not wait for the kernel corpus (it changes no plan,
    # only each layer's roofline_ms, then from the model's own layer fits): the daemon
    # measures it after a background plan (test_background_plan.py)
    assert not list((tmp_path / "st" / "corpus").glob("*.json"))
    assert all(layer["roofline_ms"] > 0 for layer in plan["layers"])
    again = json.loads(cli(tmp_path, "plan", "tf", "--json").stdout)
    assert again["from_cache"] and again["hash"] == plan["hash"]
    text = cli(tmp_path, "plan", "tf")
    assert "runner-up" in text.stdout and "predicted" in text.stdout
    bench = cli(tmp_path, "bench", "tf", "--json", "--runs", "3", "--compiles", "3")
    assert bench.returncode == 0, bench.stderr
    data = json.loads(bench.stdout)
    # three fresh compiles of every variant, rotated: every round ran one of them
    assert set(data["compiles"].values()) == {3} and data["runs"] >= 3
    assert set(data["plan"]) >= {"median_ms", "predicted_ms", "targets", "error", "alone_ms"}
    # the prediction is of the plan run alone; the interleaved median is reported beside it
    plan_row = data["plan"]
    for ratio, below in (("predicted_vs_measured", "alone_ms"),
                         ("predicted_vs_interleaved", "median_ms")):
        assert data[ratio] == pytest.approx(
            plan_row["predicted_ms"] / plan_row[below],
            abs=rounding_slack(plan_row["predicted_ms"], plan_row[below]))
    assert set(data["single"]) == {"onnxruntime/cpu/fp32", "onnxruntime/cpu/int8",
                                   "onnxruntime/cpu/int4", "onnxruntime/cpu-1t/fp32"}
    for row in data["single"].values():
        assert set(row) >= {"median_ms", "error", "within_tolerance"}
        assert row.get("p95_ms", row["median_ms"]) >= row["median_ms"]
    assert data["single"]["onnxruntime/cpu/fp32"]["error"] < 1e-5
    assert data["raw"]["median_ms"] > 0
    # no GPU provider loads here: the raw side is what a user of this machine runs, the CPU
    assert data["raw"]["runtime"] == "onnxruntime CPUExecutionProvider"
    # other work's share of the CPUs while the rounds ran and while the plan's whole models
    # were timed (a fraction of the machine: the ratios beside it are read with it)
    assert set(data["contention"]) >= {"bench", "whole_models"}
    assert all(0.0 <= v <= 1.0 for v in data["contention"].values())


def test_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    models(tmp_path)
    res = cli(tmp_path, "plan", "nope")
    assert res.returncode == 2
    assert "unknown model 'nope'" in res.stderr and "tf" in res.stderr
    res = cli(tmp_path, "bench", "tf", "--compiles", "0")
    assert res.returncode == 2 and "--compiles 0: allowed 1..8" in res.stderr


def test_plan_over_http_and_commands(tmp_path: Path, daemon_factory: Any) -> None:
    models(tmp_path)
    # the corpus is the CLI test's; here it would only add its measuring time
    cfg = CONFIG.replace("[dispatch]\n", "[dispatch]\nkernel_corpus = false\n") \
        + f'[daemon]\nmodel_dir = "{tmp_path / "models"}"\ndemo_models = false\n'
    d = daemon_factory(cfg).start()
    try:
        status, plan = d.request("GET", "/v1/plan/tf?wait=true")
        assert status == 200
        check_plan_shape(plan)
        status, reply = d.request("POST", "/v1/commands/plan.get", {"model": "tf"})
        assert status == 200 and reply["result"]["hash"] == plan["hash"]
        status, err = d.request("GET", "/v1/plan/missing")
        assert status == 404 and err["error"]["field"] == "model"
        status, err = d.request("POST", "/v1/commands/plan.replan", {"model": "tf", "x": 1})
        assert status == 400 and err["error"]["field"] == "x"
        status, reply = d.request("POST", "/v1/commands/plan.replan", {"model": "tf"})
        assert status == 200 and reply["result"]["model"] == "tf"
        assert d.request("GET", "/healthz")[0] == 200  # still serving
    finally:
        d.stop()


def test_bench_times_a_target_compiled_to_another_ones_bytes_once(tmp_path: Path) -> None:
    # no MatMul weights to pack: int4 of this CNN is its fp32 model, byte for byte
    onnx_gen.small_cnn(tmp_path / "models" / "cnn.onnx", size=16, channels=(4,))
    res = cli(tmp_path, "bench", "cnn", "--json", "--runs", "2")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert "onnxruntime/cpu/int4" not in data["single"]
    assert data["skipped"]["onnxruntime/cpu/int4"] == \
        "the same compiled model as onnxruntime/cpu/fp32"
    assert {"onnxruntime/cpu/fp32", "onnxruntime/cpu/int8"} <= set(data["single"])
    # no --compiles: a plan this light (well under 1 ms a call) rotates 8 compiles of each
    assert data["plan"]["median_ms"] < 1.0
    assert set(data["compiles"].values()) == {8}


def test_bench_keeps_fewer_rotated_compiles_when_they_would_not_fit() -> None:
    from edgepilot.dispatch.bench import compiles_that_fit

    mb = 1 << 20
    assert compiles_that_fit(10 * mb, 6, 2, 8 << 30) == 2  # a small model: as asked
    # a 65 MB model in 7 variants on a board with 2.5 GB free: 1.8 GB a rotation
    assert compiles_that_fit(65 * mb, 7, 2, 2560 * mb) == 1
    assert compiles_that_fit(65 * mb, 7, 4, 16 << 30) == 4
    assert compiles_that_fit(500 * mb, 7, 2, 1 << 30) == 1  # never none


def test_the_plan_alone_is_timed_on_every_compile_for_its_budget() -> None:
    """The plan's solo timing (what the prediction is compared with) calls every rotated
    compile after an untimed call, for its share of the budget and never fewer than BURST."""
    import time

    from edgepilot.dispatch.bench import BURST, solo_ms

    calls: list[int] = []

    def sleeper(k: int, s: float) -> Any:
        def run(feed: dict[str, Any]) -> dict[str, Any]:
            calls.append(k)
            time.sleep(s)
            return {}
        return run

    ms = solo_ms([sleeper(0, 0.001), sleeper(1, 0.003)], {}, budget_s=0.0)
    assert calls == [0] * (1 + BURST) + [1] * (1 + BURST)   # the untimed call, then BURST
    assert 1.0 <= ms < 10.0                                  # median of 1 ms and 3 ms calls
    calls.clear()
    solo_ms([sleeper(0, 0.0005)], {}, budget_s=0.05)
    assert len(calls) > 1 + BURST                            # the budget, not the floor
