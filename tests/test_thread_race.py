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
from edgepilot.dispatch.planning.choice import RACE_MIN_MS
from edgepilot.formats.onnx_gen import mlp_stack

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
    faster: the race moves to it on its second call and visits the other no more than
    EXPLORE_SHARE of the time; when the board changes again, it moves back."""
    two, one = Sleeper("cpu", 0.005), Sleeper("cpu-1t", 0.0005)
    race = ThreadRace([two, one])
    for _ in range(300):
        race.run({})
    assert race.serving_target == "onnxruntime/cpu-1t/fp32" and race.switches == 1
    assert two.calls == 1  # its first call; a turn there costs 2 x 10x: 2000 calls apart
    assert race._spacing() > 10 * EXPLORE_EVERY  # about 2 x 10 / EXPLORE_SHARE
    # the board changes: the one-thread session is ten times slower now
    one.seconds = 0.005
    two.seconds = 0.0005
    for _ in range(300):  # its time rises, the turns come closer, the other is found faster
        race.run({})
    assert race.serving_target == "onnxruntime/cpu/fp32" and race.switches == 2
    assert race.describe()["serving"] == "onnxruntime/cpu/fp32"
    assert one.calls + two.calls == 600


def test_a_plan_whole_on_one_cpu_thread_count_races_the_other(
        tmp_path: Path, mlp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    targets = [Target("onnxruntime", "cpu", "fp32"), Target("onnxruntime", "cpu-1t", "fp32")]
    # milliseconds a call (a model under RACE_MIN_MS is not raced: see the end)
    wide = tmp_path / "wide.onnx"
    mlp_stack(wide, widths=(512, 1024, 1024, 512), batch=64)
    md = ModelDispatch("wide", wide, {"onnxruntime": ort_backend}, targets,
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
    # with one thread count only, or a model of microseconds, the plan is its session alone
    for model, path, allowed in (("wide", wide, targets[:1]), ("mlp", mlp_path, targets)):
        alone = ModelDispatch(model, path, {"onnxruntime": ort_backend}, allowed,
                              DispatchOptions(tolerance=0.1, runs=3, warmup=1))
        alone.prepare()
        assert alone.compiled is not None and alone.builder is not None
        assert not isinstance(alone.compiled.segments[0].exe, ThreadRace)
    assert alone.builder.profile.extra["whole_ms"][alone.plan.segments[0][0]] < RACE_MIN_MS
