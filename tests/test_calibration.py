"""Segment calibration: predictions come from earlier end-to-end timings, never from the
measurement they are compared with; whole-model ratios predict whole models only."""

from __future__ import annotations

import statistics
from pathlib import Path

import dispatch_fixtures
import pytest

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.graph.partition import partition
from edgepilot.dispatch.measuring import calibration
from edgepilot.dispatch.measuring.calibration import Calibration, Observation
from edgepilot.dispatch.measuring.cells import Cell, LatencyTable
from edgepilot.dispatch.measuring.hops import pair_costs
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch
from edgepilot.dispatch.planning.cache import PlanCache
from edgepilot.dispatch.planning.plan import CostBuilder

mlp_path = dispatch_fixtures.mlp_path
ort_backend = dispatch_fixtures.ort_backend
FP32 = Target("onnxruntime", "cpu", "fp32")


def test_factor_uses_the_same_range_then_partial_segments_never_the_whole() -> None:
    cal = Calibration([])
    cal.add(Observation("t", 0, 4, 1.0, 0.5, "profile"))     # whole model ran at half its sum
    assert cal.factor("t", 0, 4, 4) == 0.5
    assert cal.factor("t", 0, 2, 4) == 1.0                   # not applied to a part
    assert cal.factor("other", 0, 4, 4) == 1.0
    cal.add(Observation("t", 2, 4, 1.0, 1.2))
    cal.add(Observation("t", 1, 3, 1.0, 1.4))
    assert cal.factor("t", 2, 4, 4) == pytest.approx(1.2)    # its own measurement first
    assert cal.factor("t", 0, 1, 4) == pytest.approx(1.3)    # median of partial segments
    cal.add(Observation("t", 0, 4, 1.0, 50.0))               # a broken timing is refused
    assert cal.factor("t", 0, 4, 4) == 0.5
    again = Calibration.from_list(cal.as_list())
    assert again.observations == cal.observations


def test_plans_are_predicted_from_earlier_timings_only(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    cache = PlanCache(tmp_path / "plans")
    md = ModelDispatch("mlp", mlp_path, {"onnxruntime": ort_backend}, [FP32],
                       DispatchOptions(runs=3, warmup=1), cache=cache)
    plan = md.prepare()
    assert md.builder is not None and plan.measured_ms is not None
    obs = md.builder.calibration.observations
    assert [o.source for o in obs] == ["profile", "plan"]
    # the first plan is the whole file: predicted by the profile's whole-model timing ...
    whole = md.builder.profile.extra["whole_ms"][str(FP32)]
    assert plan.predicted_ms == pytest.approx(whole)
    assert plan.uncalibrated_ms == pytest.approx(obs[0].predicted_ms)
    # ... and its own check became an observation only after it was reported
    assert obs[1].measured_ms != whole
    assert plan.as_dict()["predicted_vs_measured"] == round(plan.predicted_ms /
                                                            plan.measured_ms, 3)
    # the observations travel with the cached profile: a restart predicts from them
    md2 = ModelDispatch("mlp", mlp_path, {"onnxruntime": ort_backend}, [FP32],
                        DispatchOptions(runs=3, warmup=1), cache=cache)
    plan2 = md2.prepare()
    assert md2.from_cache and md2.builder is not None
    obs2 = md2.builder.calibration.observations
    assert [o.source for o in obs2] == ["profile", "plan", "plan"]
    assert obs2[:2] == obs[:2]
    # predicted from the two earlier timings; its own (the third) came after
    assert plan2.predicted_ms == pytest.approx(
        obs2[0].predicted_ms * statistics.median([obs2[0].ratio, obs2[1].ratio]))
    assert obs2[2].measured_ms != obs2[1].measured_ms


def test_a_new_split_is_predicted_from_its_segments_timed_alone_before_its_check(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every observation kept: on a loaded 2-core machine a sub-millisecond segment can read
    # 5x its layer sum, which the outlier rule (tested on its own) drops, and this test
    # checks the order the observations are taken in, not that rule (failed 1 in 4 at load 3-4)
    monkeypatch.setattr(calibration, "RATIO_BOUNDS", (0.0, float("inf")))
    int8 = Target("onnxruntime", "cpu", "int8")
    md = ModelDispatch("mlp", mlp_path, {"onnxruntime": ort_backend}, [FP32, int8],
                       DispatchOptions(runs=3, warmup=1, tolerance=1.0))
    md.prepare()
    assert md.builder is not None and md.part is not None
    n = len(md.part.layers)
    # pin a split no profile ever timed as segments: layer 0 on fp32, the rest on int8 (and
    # keep it whatever it measures side by side with one target: a negative margin)
    md.builder.forced.update({0: str(FP32), **{i: str(int8) for i in range(1, n)}})
    md.opts.hysteresis = -1.0
    before = len(md.builder.calibration.observations)
    changed, plan = md.replan("test", force=True)
    assert changed and plan.segments == [(str(FP32), 0, 1), (str(int8), 1, n)]
    new = md.builder.calibration.observations[before:]
    # each new segment timed alone first, then the plan's own check, in that order
    assert [(o.source, o.target, o.start, o.end) for o in new] == [
        ("segment", str(FP32), 0, 1), ("segment", str(int8), 1, n),
        ("plan", str(FP32), 0, 1), ("plan", str(int8), 1, n)]
    seg_fp32, seg_int8 = new[0], new[1]
    table = md.builder.table()
    hop = table.hop(1, table.targets.index(str(FP32)), table.targets.index(str(int8)))
    # the prediction rests on the standalone timings, never on the check that followed
    assert plan.predicted_ms == pytest.approx(seg_fp32.measured_ms + seg_int8.measured_ms + hop)
    # the hop is in the plan JSON: the tensor crossing, and what it was charged: its copy,
    # plus what this kind of hop measured beyond a copy if the first plan made one
    crossing = md.part.boundary_bytes(1)
    bandwidth = md.builder.profile.bandwidth_bytes_per_ms
    samples = md.builder.profile.extra.get("hops", [])
    fixed = (pair_costs([str(FP32), str(int8)], samples, bandwidth) or [[0.0, 0.0]])[0][1]
    assert crossing > 0 and hop == pytest.approx(max(0.0, crossing / bandwidth + fixed))
    assert plan.as_dict()["hops"] == [{"layer": 1, "from": str(FP32), "to": str(int8),
                                       "kind": "onnxruntime/cpu->onnxruntime/cpu",
                                       "bytes": crossing, "predicted_ms": round(hop, 4)}]
    assert [c["observations"] for c in plan.calibration] == [
        len([o for o in md.builder.calibration.observations[:before + 2] if o.target == t])
        for t in (str(FP32), str(int8))]


def test_a_one_target_plan_is_predicted_by_its_whole_model_timing_whatever_its_layers_cost(
        mlp_path: Path) -> None:
    """The ratio a whole-model observation keeps is taken on the same layer sum the prediction
    multiplies: where the planner charges a layer a twin's lower timing (a variant computing
    exactly what the reference does), the prediction is still the whole model's timing."""
    part = partition(mlp_path)
    n = len(part.layers)
    fp32, int4 = str(FP32), "onnxruntime/cpu/int4"
    # int4 timed slower on every layer it leaves as fp32 computes it (error exactly 0)
    cells = [{fp32: Cell(1.0, 0.0), int4: Cell(3.0, 0.0)} for _ in range(n)]
    whole = {fp32: 0.8 * n, int4: 2.5 * n}
    profile = LatencyTable([fp32, int4], fp32, cells, {fp32: 0.0, int4: 0.0}, 1e6,
                           extra={"whole_ms": dict(whole)})
    b = CostBuilder(part, profile, 0.05)
    table = b.table()
    assert b.layer_ms(0, int4) == 1.0  # charged its twin's lower timing
    for target in (fp32, int4):
        assign = [table.targets.index(target)] * n
        assert b.plan_ms(table, assign) == pytest.approx(whole[target])
