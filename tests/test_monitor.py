"""Monitor: EWMA drift detection and the hysteresis that keeps plans from flapping."""

from __future__ import annotations

from pathlib import Path

import dispatch_fixtures
from dispatch_fixtures import Events

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.execution.monitor import Monitor, worth_switching
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch

mlp_path = dispatch_fixtures.mlp_path
ort_backend = dispatch_fixtures.ort_backend


def test_drift_needs_samples_and_a_real_departure() -> None:
    mon = Monitor(drift_threshold=0.5, alpha=0.5, min_samples=3)
    mon.reset([1.0, 2.0])
    assert mon.observe([1.1, 2.1]) == []
    assert mon.observe([1.0, 9.0]) == []          # one spike, too few samples
    assert mon.observe([1.0, 9.0]) == [1]          # sustained: segment 1 drifted
    assert mon.ratio(0) < 1.5 and mon.ratio(1) > 1.5
    mon.reset([1.0])
    assert mon.ratio(0) == 1.0 and mon.snapshot()[0]["samples"] == 0


def test_serving_cost_of_a_tiny_model_is_no_drift() -> None:
    # a 10 µs model served at 0.15 ms (thread hand-off, cold caches): 15x, but no target's
    # slowing, and no replan can remove it; it replanned every third request before
    mon = Monitor(drift_threshold=0.5, alpha=0.5, min_samples=3)
    mon.reset([0.01, 5.0])
    for _ in range(20):
        assert mon.observe([0.15, 5.2]) == []
    assert mon.ratio(0) > 10
    assert mon.observe([1.5, 5.0]) == [] and mon.observe([1.5, 5.0]) == [0]  # over 1 ms: drift


def test_hysteresis() -> None:
    assert worth_switching(10.0, 9.0, 0.05)
    assert not worth_switching(10.0, 9.8, 0.05)
    assert not worth_switching(10.0, 10.0, 0.0)


def test_replan_without_gain_keeps_the_plan(mlp_path: Path,
                                            ort_backend: OnnxRuntimeBackend) -> None:
    events = Events()
    md = ModelDispatch("mlp", mlp_path, {"onnxruntime": ort_backend},
                       [Target("onnxruntime", "cpu", "fp32"), Target("onnxruntime", "cpu", "int8")],
                       DispatchOptions(tolerance=0.1, runs=3, warmup=1), emit=events)
    plan = md.prepare()
    applied, again = md.replan("test")
    assert not applied and again.hash == plan.hash
    assert events.of("plan.changed") == []
    # a clock report without a measured baseline leaves costs (and the plan) as they are
    md.set_clocks({"cpu": 1.0}, "profile.applied")
    assert md.plan is not None and md.plan.hash == plan.hash
    # a forced replan after excluding the chosen target must move and announce it
    assert md.builder is not None
    md.builder.excluded.add(plan.targets[0])
    applied, moved = md.replan("operator", force=True)
    assert applied and plan.targets[0] not in moved.targets
    assert events.of("plan.changed")[-1]["previous"] == plan.hash
