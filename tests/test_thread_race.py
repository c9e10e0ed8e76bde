"""A whole model on one onnxruntime CPU thread count served beside the other, the faster live
(dispatch/execution/thread_race.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dispatch_fixtures
import numpy as np

from edgepilot.backends.base import Executable, Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.execution.thread_race import EXPLORE_EVERY, ThreadRace
from edgepilot.dispatch.measuring.tolerance import output_error
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch

mlp_path = dispatch_fixtures.mlp_path
ort_backend = dispatch_fixtures.ort_backend


class Sleeper(Executable):
    def __init__(self, device: str, seconds: float) -> None:
        self.target = Target("onnxruntime", device, "fp32")
        self.inputs, self.outputs = [], []
        self.seconds, self.calls = seconds, 0

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        time.sleep(self.seconds)
        return {"y": np.zeros(1)}


def test_the_faster_session_serves_and_the_other_is_only_sampled() -> None:
    """Planned on two threads in a window where they won, served where one thread is 10x
    faster: the race moves to it and keeps sampling the other one call in EXPLORE_EVERY."""
    two, one = Sleeper("cpu", 0.005), Sleeper("cpu-1t", 0.0005)
    race = ThreadRace([two, one])
    for _ in range(10 * EXPLORE_EVERY):
        race.run({})
    assert race.serving_target == "onnxruntime/cpu-1t/fp32" and race.switches == 1
    # its first call, then one in EXPLORE_EVERY of the 10 * EXPLORE_EVERY (the other's first
    # timing came second, and it serves since)
    assert two.calls <= 1 + 10
    # the board changes again: the two-thread session is the faster one now
    two.seconds, one.seconds = 0.0005, 0.005
    for _ in range(10 * EXPLORE_EVERY):
        race.run({})
    assert race.serving_target == "onnxruntime/cpu/fp32" and race.switches == 2
    assert race.describe()["serving"] == "onnxruntime/cpu/fp32"


def test_a_plan_whole_on_one_cpu_thread_count_races_the_other(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    targets = [Target("onnxruntime", "cpu", "fp32"), Target("onnxruntime", "cpu-1t", "fp32")]
    md = ModelDispatch("mlp", mlp_path, {"onnxruntime": ort_backend}, targets,
                       DispatchOptions(tolerance=0.1, runs=3, warmup=1))
    plan = md.prepare()
    assert md.compiled is not None and len(plan.segments) == 1
    exe: Any = md.compiled.segments[0].exe
    assert isinstance(exe, ThreadRace)
    assert {str(a.target) for a in exe.arms} == {str(t) for t in targets}
    assert str(exe.arms[0].target) == plan.segments[0][0]  # the planned one serves first
    feed = md.calibration[0]
    for _ in range(2 * EXPLORE_EVERY):  # both sessions answer, the same model
        out, _ = md.compiled.run(feed)
        assert output_error(out, md.ref_outputs[0], "rel_l2") < 1e-5
    assert all(e is not None for e in exe.ewma)
    # with one thread count only, the plan is its session alone
    alone = ModelDispatch("mlp", mlp_path, {"onnxruntime": ort_backend}, targets[:1],
                          DispatchOptions(tolerance=0.1, runs=3, warmup=1))
    alone.prepare()
    assert alone.compiled is not None
    assert not isinstance(alone.compiled.segments[0].exe, ThreadRace)
