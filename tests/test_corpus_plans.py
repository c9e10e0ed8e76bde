"""The held-out real exports of issue 16 (tests/real_models.py, from ``selfie-segmentation``
on): each plans (or is planned whole, with its reason), with no traceback, and the plan's
outputs are within the model's tolerance of the raw runtime on the same file and input.

Profiles are measured once per machine and kept in a plan cache shared by test runs
(``$EDGEPILOT_TEST_PLAN_CACHE``, default ``~/.cache/edgepilot/test-plans``; keyed like any
plan: model hash, shapes, inputs, targets, runtime versions), so ``make test`` stays short;
every run still compiles each plan, checks its error and compares it with the raw runtime.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from real_models import CORPUS, RealModel, by_name

from edgepilot.config import Config
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.measuring.tolerance import output_error
from edgepilot.dispatch.model_dispatch import ModelDispatch
from edgepilot.dispatch.raw import raw_runner

pytestmark = pytest.mark.slow
HELD_OUT = CORPUS[CORPUS.index(by_name("selfie-segmentation")):]
STATE = Path(os.environ.get("EDGEPILOT_TEST_PLAN_CACHE",
                            Path.home() / ".cache" / "edgepilot" / "test-plans"))


# Arm NN's only backend off ARM is CpuRef, its unoptimised reference kernels: one timed run of a
# DeepLab layer at 257x257 takes seconds there, and measuring every cell of it takes longer than
# a test may (bench/real_bench.py plans it with every backend). On a board, CpuAcc runs it.
WITHOUT_ARMNN = {"deeplabv3"}


def config(model: RealModel) -> Config:
    backends = ({"enabled": ["onnxruntime", "tflite"]} if model.name in WITHOUT_ARMNN else {})
    return Config.model_validate({
        "daemon": {"state_dir": str(STATE), "demo_models": False}, "backends": backends,
        "dispatch": {"profile_runs": 3, "warmup_runs": 1, "profile_passes": 1,
                     "calibration_inputs": 1, "kernel_corpus": False}})


@pytest.mark.parametrize("model", HELD_OUT, ids=lambda m: m.name)
def test_held_out_model_plans_within_tolerance_of_the_raw_runtime(model: RealModel) -> None:
    md = Dispatcher(config(model)).get(str(model.path), {k: tuple(v) for k, v in
                                                    model.input_shapes.items()} or None)
    assert isinstance(md, ModelDispatch)
    md.prepare()
    plan = md.explain()
    assert md.compiled is not None
    assert plan["error"] is not None and plan["error"] <= plan["tolerance"], plan["error"]
    assert all("\n" not in e["reason"] for e in plan["exclusions"])
    assert plan["planning_s"] is not None and plan["planning_s"] > 0
    if len(plan["segments"]) > 1:  # a split serves only after beating one target side by side
        assert plan["versus_single"] is not None and plan["versus_single"]["kept"] == "plan"
    elif plan["versus_single"] is not None and plan["versus_single"]["kept"] == "single":
        assert plan["reason"].startswith("single target")  # a split or a rival lost
    elif plan["versus_single"] is not None:  # a close rival target timed side by side, lost
        assert plan["versus_single"]["target"] != plan["segments"][0]["target"]
    feed = md.calibration[0]
    got, _ = md.compiled.run(feed)
    raw = raw_runner(md)(feed)
    assert set(got) == set(raw)
    for name, ref in raw.items():
        assert np.shape(got[name]) == np.shape(ref), name
        err = output_error({name: got[name]}, {name: ref}, md.opts.metric)
        assert err <= plan["tolerance"], (name, err)


@pytest.mark.parametrize("name", ["efficientnet-lite0", "micro-wakeword"])
def test_a_quantized_tflite_file_is_checked_against_what_the_interpreter_computes(
        name: str) -> None:
    # the raw LiteRT Interpreter runs an int8 file through XNNPACK, whose rounding is not the
    # builtin kernels' (an int8 MobileNetV2: 0.094 apart): the reference is the interpreter's
    model = by_name(name)
    md = Dispatcher(config(model)).get(str(model.path), {k: tuple(v) for k, v in
                                                    model.input_shapes.items()} or None)
    assert isinstance(md, ModelDispatch)
    md.prepare()
    assert md.reference is not None and md.reference.device == "xnnpack", md.reference
    raw = raw_runner(md)(md.calibration[0])
    assert output_error(md.ref_outputs[0], raw, md.opts.metric) <= 1e-6
