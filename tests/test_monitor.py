"""Monitor: EWMA drift detection and the hysteresis that keeps plans from flapping."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dispatch_fixtures
import pytest
from dispatch_fixtures import Events, HookedBackend
from other_load import burners

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.execution.monitor import Monitor, worth_switching
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch
from edgepilot.dispatch.planning.drift import MAX_LOAD_SLOWDOWN, apply_drift, load_slowdown

HOOKED = Target("hooked", "cpu", "int8")

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
    # its side by sides decided: one timed while other work took the CPUs decides nothing, and
    # a replan times it again (test_contention); on a busy machine prepare()'s can be such
    assert md.builder is not None
    for verdict in md.builder.profile.extra.get("versus_all", []):
        verdict["contention"] = 0.0
    applied, again = md.replan("test")
    assert not applied and again.hash == plan.hash
    assert events.of("plan.changed") == []
    # a clock report without a measured baseline leaves costs (and the plan) as they are
    md.set_clocks({"cpu": 1.0}, "profile.applied")
    assert md.plan is not None and md.plan.hash == plan.hash
    # a forced replan after excluding the chosen target must move and announce it
    md.builder.excluded.add(plan.targets[0])
    applied, moved = md.replan("operator", force=True)
    assert applied and plan.targets[0] not in moved.targets
    assert events.of("plan.changed")[-1]["previous"] == plan.hash


def test_the_baseline_is_how_the_plan_ran_when_installed() -> None:
    # a whole model a rival target won side by side: its layers' sum said 17.4 ms, it runs at
    # 26.7; held against the prediction it drifted every third request, forever (malviz)
    mon = Monitor(drift_threshold=0.5, alpha=0.5, min_samples=3)
    mon.install([17.4], [26.7])
    for _ in range(20):
        assert mon.observe([27.0]) == []
    assert mon.observe([45.0]) == [] and mon.observe([45.0]) == [0]  # a real slowing still is
    # the same plan re-predicted (a drifted factor, new clocks): as far off as it was
    mon.expect([17.4 * 1.5])
    assert mon.predicted == [pytest.approx(26.7 * 1.5)] and mon.snapshot()[0]["samples"] == 0
    mon.install([2.0, 3.0], [])  # nothing measured: the predictions
    assert mon.predicted == [2.0, 3.0]


def test_a_plan_is_watched_from_its_measured_segments(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    hooked = HookedBackend(ort_backend)
    fp32 = Target("onnxruntime", "cpu", "fp32")
    events = Events()
    # a negative hysteresis pins what the costs choose (no side by side with a rival)
    md = ModelDispatch("mlp", mlp_path, {"onnxruntime": ort_backend, "hooked": hooked},
                       [fp32, HOOKED], DispatchOptions(tolerance=0.1, runs=3, warmup=1,
                                                       hysteresis=-1.0), emit=events)
    md.prepare()
    assert md.builder is not None
    md.builder.excluded.add(str(HOOKED))  # on fp32 first, whatever this CPU's int8 does
    md.replan("operator", force=True)
    # then onto a target now 20 ms slower a call than its layers were profiled at
    hooked.delay_s = 0.02
    md.builder.excluded = {str(fp32)}
    applied, plan = md.replan("operator", force=True)
    assert applied and plan.targets[0] == str(HOOKED) and md.compiled is not None
    # what it is watched against: the segments as they ran at install (their predictions may
    # rest on the delay-free profile or on the new segment's own timing, as the profile went)
    assert md.monitor.predicted == pytest.approx(md.segment_ms)
    feed = md.calibration[0]
    for _ in range(8):
        md.run(feed)
    # how it ran when installed is no drift: no replan reset the monitor or moved the plan
    assert sum(s["samples"] or 0 for s in md.monitor.snapshot()) == 8 * len(md.segment_ms)
    assert md.plan is not None and md.plan.hash == plan.hash


def test_a_plan_that_lost_to_the_served_target_is_not_built_again(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    fp32, int8 = Target("onnxruntime", "cpu", "fp32"), Target("onnxruntime", "cpu", "int8")
    md = ModelDispatch("mlp", mlp_path, {"onnxruntime": ort_backend}, [fp32, int8],
                       DispatchOptions(tolerance=0.1, runs=3, warmup=1))
    plan = md.prepare()
    assert md.builder is not None and len(set(plan.targets)) == 1
    served, other = plan.targets[0], str(int8 if plan.targets[0] == str(fp32) else fp32)
    md.builder.factors[served] = 20.0  # the costs now say: move every layer to the other
    verdict = {"segments": [[other, 0, len(plan.targets)]], "target": served, "kept": "single"}
    md.builder.profile.extra["versus_all"] = [verdict]
    applied, kept = md.replan("drift")
    assert not applied and kept.hash == plan.hash  # it lost to this very plan side by side
    md.builder.profile.extra["versus_all"] = []  # never timed against it: built and timed
    applied, _ = md.replan("drift")
    assert applied


def test_drift_under_other_work_scales_every_target_of_the_device_alike() -> None:
    """Under a load test the one target serving was seen to slow, only its costs were scaled,
    the replan moved to a target that looked faster, which slowed in turn: three plan changes
    in four seconds. With other work on the CPUs, the device's other targets are scaled too,
    as far as the load explains (a share c of the CPUs: up to 1 / (1 - c))."""
    gpu, int8 = "onnxruntime/cuda/fp32", "onnxruntime/cpu/int8"
    fp32, one = "onnxruntime/cpu/fp32", "onnxruntime/cpu-1t/fp32"

    def costs() -> Any:
        return SimpleNamespace(profile=SimpleNamespace(targets=[fp32, one, int8, gpu]),
                               factors={})

    quiet = costs()
    apply_drift(quiet, [(fp32, 1.6)], contention=0.0)
    assert quiet.factors == {fp32: 1.6}
    busy = costs()
    lines = apply_drift(busy, [(fp32, 1.6)], contention=0.7)
    assert busy.factors == {fp32: 1.6, one: 1.6, int8: 1.6}  # the GPU untouched
    assert any("70% of the CPUs" in line for line in lines)
    # slowed far past what the load explains (one core of two: 2x): its own, it loses
    past = costs()
    apply_drift(past, [(fp32, 10.0), (one, 12.0)], contention=0.5)
    assert past.factors == {fp32: 10.0, one: 12.0, int8: pytest.approx(2.0)}
    assert load_slowdown(0.5) == pytest.approx(2.0) and load_slowdown(1.0) == MAX_LOAD_SLOWDOWN


def test_under_other_work_a_drift_is_put_on_the_device_as_far_as_the_load_explains(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    """Served on a target that then slows 20 ms a call while other processes take the CPUs:
    the load explains some of it, and every target of the device is scaled by that much; the
    rest is the target's own (a delegate gone bad), and it still loses its layers."""
    hooked = HookedBackend(ort_backend)
    fp32 = Target("onnxruntime", "cpu", "fp32")
    md = ModelDispatch("mlp", mlp_path, {"onnxruntime": ort_backend, "hooked": hooked},
                       [fp32, HOOKED], DispatchOptions(tolerance=0.1, runs=3, warmup=1))
    md.prepare()
    assert md.builder is not None
    md.builder.excluded.add(str(fp32))
    _, plan = md.replan("operator", force=True)
    assert plan.targets[0] == str(HOOKED)
    md.builder.excluded.clear()
    hooked.delay_s = 0.02
    feed = md.calibration[0]
    with burners():  # one busy process per CPU
        for _ in range(8):
            md.run(feed)
            if md.plan is not None and str(HOOKED) not in md.plan.targets:
                # moved: what fp32 shows from here on under the burners is its own slowing
                # (a two-thread pool waits on whichever worker the load descheduled: 13x seen
                # here), a drift of its own, not the load-explained scaling asserted below
                break
    factors = md.builder.factors
    # the whole device slowed by what the load explains, the drifted target by all it showed
    assert 1.0 < factors[str(fp32)] <= MAX_LOAD_SLOWDOWN < factors[str(HOOKED)]
    assert md.plan is not None and str(HOOKED) not in md.plan.targets


def test_a_request_never_waits_for_a_replan_to_watch_its_times(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    """A drift replan holds the model for seconds (compiles, a side by side): a request that
    finished meanwhile drops its times rather than queueing behind it (a 6 ms request took
    3.8 s)."""
    import threading

    md = ModelDispatch("mlp", mlp_path, {"onnxruntime": ort_backend},
                       [Target("onnxruntime", "cpu", "fp32")],
                       DispatchOptions(tolerance=0.1, runs=3, warmup=1))
    md.prepare()
    current = md.current()
    assert current is not None
    compiled = current[0]
    held, release = threading.Event(), threading.Event()

    def replanning() -> None:
        with md._lock:
            held.set()
            release.wait(5)

    t = threading.Thread(target=replanning)
    t.start()
    held.wait(5)
    before = [s["samples"] or 0 for s in md.monitor.snapshot()]
    # (waiting, it would have watched them once the holder gave up after 5 s)
    md.observe(compiled, [1.0] * len(compiled.segments))
    release.set()
    t.join()
    assert [s["samples"] or 0 for s in md.monitor.snapshot()] == before
    md.observe(compiled, [1.0] * len(compiled.segments))  # free again: watched
    assert [s["samples"] or 0 for s in md.monitor.snapshot()] != before
