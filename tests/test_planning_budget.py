"""``[dispatch] planning_budget_s``: a model whose per-layer profile the budget cannot pay for
is planned whole (issue 16, goal 4: a TTS model at 4-5 s a run planned for 4-7 minutes).

On real exports (a Paddle ONNX recognizer, a MediaPipe fp16-weight TFLite file), served by the
daemon over HTTP with a budget no per-layer profile fits in: the plan is one layer, its notes
say why and name the setting, every target's whole model was timed, and the answers are within
tolerance of the raw runtime. A budget of 0 is none; a negative one is refused naming the key.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_proc import DaemonProcess
from real_models import by_name
from test_real_models import raw_outputs

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.graph.partition import partition
from edgepilot.dispatch.measuring.budget import out_of_budget, timed_whole, whole_only
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch

MODELS = {"ppocr-rec": {"x": (1, 3, 48, 320)}, "hand-landmark": {}}


def feed_for(name: str) -> dict[str, np.ndarray]:
    model = by_name(name)
    rng = np.random.default_rng(1)
    if model.suffix == ".onnx":
        shape = MODELS[name]["x"]
        return {"x": rng.random(shape, dtype=np.float32)}
    from ai_edge_litert.interpreter import Interpreter

    d = Interpreter(model_path=str(model.path)).get_input_details()[0]
    return {d["name"]: rng.random(tuple(d["shape"]), dtype=np.float32)}


def test_the_estimate_plans_a_multi_second_model_whole_and_a_light_one_per_layer() -> None:
    # Kokoro-82M int8: 4.5 s a run, 22 layers, five targets: ~99 s of per-layer profile
    why = whole_only([9000.0, 4500.0], 22, 5, 90.0)
    assert why is not None and "planning_budget_s (90 s)" in why and "~99 s" in why
    assert whole_only([300.0, 110.0], 22, 5, 90.0) is None      # a DBNet detector
    assert whole_only([9000.0, 4500.0], 22, 5, 0.0) is None     # no budget
    assert whole_only([9000.0, 4500.0], 22, 5, 400.0) is None   # a budget that pays for it
    assert whole_only([9000.0], 1, 5, 90.0) is None             # one layer already
    assert whole_only([9000.0], 22, 1, 90.0) is None            # one target: nothing to split


def test_a_model_planned_whole_is_never_cut_nor_probed(tmp_path: Path) -> None:
    # the reference's run of the file decides the budget first: a TTS model's shape probe
    # (every intermediate tensor of a run, 13 GB) and cut are not paid for a one-layer plan
    model = by_name("ppocr-rec")
    targets = [Target("onnxruntime", "cpu", p) for p in ("fp32", "int8")]
    md = ModelDispatch("rec", model.path, {"onnxruntime": OnnxRuntimeBackend()}, targets,
                       DispatchOptions(runs=3, warmup=1, planning_budget_s=0.001),
                       shapes={"x": (1, 3, 48, 320)}, graph_dir=tmp_path / "graphs")
    plan = md.prepare()
    assert md.part is not None and len(md.part.layers) == 1 and len(plan.segments) == 1
    assert md.part.tensor_bytes == {} and md.part.nodes  # its outline: operators, no sizes
    assert md.part.layers[0].op_types and "planned whole" in " ".join(plan.merged)
    # the plan is the reference's own session: its check is the reference itself (error 0,
    # the second calibration input not run at all), the other targets out of the budget
    assert plan.targets == [str(md.reference)] and plan.error == 0.0
    assert not md.check.reference_made
    assert {e["target"] for e in plan.exclusions} == {str(targets[1])}
    assert not (tmp_path / "graphs").exists() or not any((tmp_path / "graphs").iterdir())
    feed = md.calibration[0]
    out, _ = md.run(feed)
    ref = raw_outputs(model, feed)
    for name, value in ref.items():
        err = np.linalg.norm(out[name] - value) / max(float(np.linalg.norm(value)), 1e-12)
        assert err <= 0.05, (name, err)


def test_a_target_the_budget_has_no_room_for_is_not_run() -> None:
    # Kokoro at 11-13 s a run on five targets: the budget is a bound, not a wish
    now = time.monotonic()
    assert out_of_budget([13000.0], now + 60) == ""             # ~39 s of runs fit in 60
    why = out_of_budget([13000.0, 40000.0], now + 30)           # the fastest run sets the pace
    assert why.startswith("not timed") and "planning_budget_s" in why and "~39 s" in why
    assert out_of_budget([13000.0], None) == ""                 # no budget
    assert out_of_budget([], now) == ""                         # no figure to judge by


def test_a_whole_model_plan_is_not_timed_again() -> None:
    # the executable served is the one the profile timed as a plan: four more runs of a
    # 4 s model (a warm-up and three) were a tenth of Kokoro's planning
    assert timed_whole([("ort/cpu/fp32", 0, 1)], 1, {"ort/cpu/fp32": 4000.0}) == \
        (4000.0, [4000.0], [4000.0, 4000.0])
    assert timed_whole([("a", 0, 1), ("b", 1, 2)], 2, {"a": 1.0, "b": 1.0}) is None  # a split
    assert timed_whole([("b", 0, 1)], 1, {"a": 1.0}) is None  # a target the profile lacks


def test_a_model_over_the_budget_is_planned_whole_and_served_within_tolerance(
        tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in MODELS:
        m = by_name(name)
        shutil.copy(m.path, models / f"{name}{m.suffix}")
        shapes = {k: tuple(v) for k, v in MODELS[name].items()} or None
        assert len(partition(m.path, shapes=shapes).layers) > 1  # cut per layer otherwise
    cfg = (f'[mqtt]\nenabled = false\n[daemon]\nmodel_dir = "{models}"\n'
           "[dispatch]\nkernel_corpus = false\nprofile_runs = 3\nwarmup_runs = 1\n"
           "planning_budget_s = 0.001\n")
    d = DaemonProcess(tmp_path, cfg, extra_args=["--model-dir", str(models)]).start(timeout=120)
    try:
        for name in MODELS:
            feed = feed_for(name)
            body = infer(d, name, feed)
            deadline = time.monotonic() + 300
            while body["plan"].startswith("single:") and time.monotonic() < deadline:
                time.sleep(1.0)
                body = infer(d, name, feed)
            code, plan = d.request("GET", f"/v1/plan/{name}")
            assert code == 200 and plan["hash"] == body["plan"], (plan, d.output()[-3000:])
            assert len(plan["layers"]) == 1 and len(plan["segments"]) == 1, plan["layers"]
            note = " ".join(plan["merged"])
            assert "planned whole" in note and "planning_budget_s" in note, plan["merged"]
            ref = raw_outputs(by_name(name), feed)  # the runtime a user would run instead
            got = {n: np.asarray(o["data"], dtype=o["dtype"]).reshape(o["shape"])
                   for n, o in infer(d, name, feed)["outputs"].items()}
            assert set(got) == set(ref)
            for out, value in ref.items():
                a, b = got[out].astype(np.float64), value.astype(np.float64)
                err = np.linalg.norm(a - b) / max(float(np.linalg.norm(b)), 1e-12)
                assert err <= 0.05, (name, out, err)
    finally:
        d.stop()


def infer(d: DaemonProcess, name: str, feed: dict[str, np.ndarray]) -> dict[str, Any]:
    body = {"inputs": {n: {"data": a.ravel().tolist(), "dtype": str(a.dtype),
                           "shape": list(a.shape)} for n, a in feed.items()}}
    code, answer = d.request("POST", f"/v1/infer/{name}", body, timeout=120)
    assert code == 200, answer
    return answer


@pytest.mark.parametrize("value", ["-1", '"soon"'])
def test_a_bad_budget_is_refused_naming_the_key(tmp_path: Path, value: str) -> None:
    cfg = tmp_path / "edgepilot.toml"
    cfg.write_text(f"[dispatch]\nplanning_budget_s = {value}\n[mqtt]\nenabled = false\n")
    out = subprocess.run([sys.executable, "-m", "edgepilot", "--config", str(cfg),
                          "--state-dir", str(tmp_path / "st"), "doctor"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "planning_budget_s" in out.stderr + out.stdout
