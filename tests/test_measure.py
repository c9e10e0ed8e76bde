"""Measurer on real onnxruntime targets: latency, error vs fp32, unsupported cells, hops."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import dispatch_fixtures
import numpy as np
import pytest

from edgepilot.backends.base import Backend, Executable, Segment, Support, Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.graph.partition import partition
from edgepilot.dispatch.measuring.cells import LatencyTable
from edgepilot.dispatch.measuring.measure import Measurer
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch
from edgepilot.formats import onnx_gen

mlp_path = dispatch_fixtures.mlp_path
ort_backend = dispatch_fixtures.ort_backend

FP32 = Target("onnxruntime", "cpu", "fp32")
INT8 = Target("onnxruntime", "cpu", "int8")
INT4 = Target("onnxruntime", "cpu", "int4")
QNN = Target("onnxruntime", "qnn", "int8")  # not on this machine


def test_every_cell_is_measured_against_fp32(mlp_path: Path,
                                             ort_backend: OnnxRuntimeBackend) -> None:
    part = partition(mlp_path)
    seen: list[tuple[int, int, str]] = []
    prof = Measurer(part, {"onnxruntime": ort_backend}, [FP32, INT8, INT4, QNN], FP32,
                    onnx_gen.sample_inputs(mlp_path, count=2), runs=3, warmup=1,
                    progress=lambda done, total, label: seen.append((done, total, label)))
    table = prof.table()
    assert len(table.cells) == len(part.layers) >= 2
    for row in table.cells:
        assert row[str(FP32)].ms is not None and row[str(FP32)].ms > 0
        assert row[str(FP32)].error is not None and row[str(FP32)].error < 1e-5
        assert 0 < (row[str(INT8)].error or 0) < 0.2
        assert (row[str(INT4)].error or 0) > (row[str(INT8)].error or 0)
        assert row[str(INT8)].memory < row[str(FP32)].memory
        assert row[str(QNN)].ms is None and "not available" in row[str(QNN)].reason
    assert set(table.overhead_ms) == {str(t) for t in (FP32, INT8, INT4, QNN)}
    assert all(v >= 0 for v in table.overhead_ms.values())
    assert table.bandwidth_bytes_per_ms > 0
    # progress reached the end, in order
    assert seen[-1][0] == seen[-1][1] and [s[0] for s in seen] == sorted(s[0] for s in seen)
    again = LatencyTable.from_dict(table.as_dict())
    assert again.cells[0][str(INT8)].error == table.cells[0][str(INT8)].error


class _Slow(Executable):
    """A compiled segment of the fp32 runtime plus a fixed 60 ms a run: a reference-kernel
    target (Arm NN CpuRef) whose runs take seconds where XNNPACK's take milliseconds."""

    def __init__(self, inner: Executable, target: Target, runs: list[str]) -> None:
        self.inner, self.target, self.runs = inner, target, runs
        self.inputs, self.outputs = inner.inputs, inner.outputs
        self.delay_s, self.ran = 0.06, dict[str, int]()

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.runs.append(self.target.precision)
        self.ran[self.target.device] = self.ran.get(self.target.device, 0) + 1
        time.sleep(self.delay_s)
        return self.inner.run(inputs)

    def close(self) -> None:
        self.inner.close()


class _SlowBackend(Backend):
    """The fp32 onnxruntime CPU target under another name, ``delay_s`` slower a run (one
    delay per device: ``cpu``, ``gpu``, ...)."""

    name = "slowref"

    def __init__(self, inner: OnnxRuntimeBackend, delays: dict[str, float] | None = None
                 ) -> None:
        self.inner, self.runs = inner, []
        self.settings = inner.settings
        self.delays = delays or {"cpu": 0.06}
        self.ran: dict[str, int] = {}

    def probe(self) -> list[Target]:
        return [Target(self.name, d, "fp32") for d in self.delays]

    def supports(self, segment: Segment, target: Target) -> Support:
        return self.inner.supports(segment, FP32)

    def compile(self, segment: Segment, target: Target) -> Executable:
        exe = _Slow(self.inner.compile(segment, FP32), target, self.runs)
        exe.delay_s, exe.ran = self.delays[target.device], self.ran
        return exe


SLOW = Target("slowref", "cpu", "fp32")


def test_a_target_far_slower_than_the_best_stops_at_its_first_run(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    """Early elimination covers a slow target's first run: a cell whose first (error) run is
    EARLY_FACTOR x over its layer's bound is not run on the other inputs, warmed up or timed;
    nor is such a whole model timed again, nor its per-call cost measured."""
    part = partition(mlp_path)
    slow = _SlowBackend(ort_backend)
    prof = Measurer(part, {"onnxruntime": ort_backend, "slowref": slow}, [FP32, SLOW], FP32,
                    onnx_gen.sample_inputs(mlp_path, count=2), runs=5, warmup=2, passes=2)
    table = prof.table()
    n = len(part.layers)
    # one run per layer and one for the whole model; without the bound it was 2 error runs,
    # 2 warm-ups and >= 3 timed runs per cell, 2 merged pairs, and the whole model twice
    assert len(slow.runs) == n + 1
    for row in table.cells:
        assert row[str(SLOW)].ms is not None and row[str(SLOW)].ms >= 60
        assert row[str(SLOW)].error is not None and row[str(SLOW)].error < 1e-5
    assert table.overhead_ms[str(SLOW)] == 0.0
    assert table.extra["whole_ms"][str(SLOW)] >= 60


@pytest.mark.parametrize(("fast_s", "slow_s", "runs"), [
    (0.020, 0.100, 1),   # heavy: its first run, 3x its bound, is figure enough
    # light: its calibration runs are no figure (Silero VAD on one thread ran them 3x its
    # warm runs, and lost the plan it wins): warmed up and timed up to the early bound
    (0.010, 0.040, 6),
])
def test_a_target_three_times_slower_than_the_best_stops_at_its_calibration_runs(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend, fast_s: float, slow_s: float,
        runs: int) -> None:
    """A heavy cell LOSER_FACTOR x over its bound (3x its layer's best: an int8 conv on a CPU
    with no dot-product instructions) is not warmed up and timed once its first calibration
    run showed it (it was 6 runs a cell, 0.7-1.3 s each on a detector); a light one is."""
    part = partition(mlp_path)
    slow = _SlowBackend(ort_backend, {"fast": fast_s, "slow": slow_s})
    fast, loser = Target("slowref", "fast", "fp32"), Target("slowref", "slow", "fp32")
    prof = Measurer(part, {"onnxruntime": ort_backend, "slowref": slow}, [fast, loser], FP32,
                    onnx_gen.sample_inputs(mlp_path, count=2), runs=5, warmup=2, passes=2)
    cell = prof.measure(0, 1, fast)
    assert cell.ms is not None and cell.ms >= fast_s * 1e3
    slow.ran.clear()
    bound = 1.5 * cell.ms
    beaten = prof.measure(0, 1, loser, bound)
    assert slow.ran == {"slow": runs}
    assert beaten.ms is not None and beaten.ms > 1.5 * bound and beaten.error is not None


class _LongInput(Executable):
    """The fp32 runtime, 60 ms slower a run, 1 s on an input whose first value is over 100
    (as a TTS model's run grows with the durations it predicts from its input's values)."""

    def __init__(self, inner: Executable, target: Target, seen: list[bool]) -> None:
        self.inner, self.target, self.seen = inner, target, seen
        self.inputs, self.outputs = inner.inputs, inner.outputs

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        long = float(next(iter(inputs.values())).flat[0]) > 100
        self.seen.append(long)
        time.sleep(1.0 if long else 0.06)  # a heavy model: 60 ms a layer, 1 s on the long one
        return self.inner.run(inputs)

    def close(self) -> None:
        self.inner.close()


class _LongInputBackend(_SlowBackend):
    name = "longin"

    def compile(self, segment: Segment, target: Target) -> Executable:
        return _LongInput(self.inner.compile(segment, FP32), target, self.runs)


def test_a_calibration_input_far_slower_than_the_others_is_left_out_of_cell_checks(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    """Each cell's error is measured on the calibration inputs whose reference run is within
    SLOW_INPUT_FACTOR x the cheapest; the slow one still ran on the reference (the whole
    plan's check uses it)."""
    feeds = onnx_gen.sample_inputs(mlp_path, count=2)
    first = next(iter(feeds[1]))
    feeds[1][first] = feeds[1][first].copy()
    feeds[1][first].flat[0] = 1000.0
    part = partition(mlp_path)
    backend = _LongInputBackend(ort_backend)
    ref = Target("longin", "cpu", "fp32")
    prof = Measurer(part, {"longin": backend}, [ref], ref, feeds, runs=3, warmup=1)
    assert len(prof.reference_envs()) == 2 and any(backend.runs)  # it ran on the reference
    assert prof.error_envs() == [prof.reference_envs()[0]]
    backend.runs.clear()
    cell = prof.measure(0, 1, ref)
    assert cell.ms is not None and cell.error == 0.0
    assert backend.runs and not any(backend.runs)  # the long input: not run by the cell


class _Traced(Executable):
    """A compiled segment of the real runtime that notes, for every run, the feed it was
    handed and the functions that called it (so a test sees which procedure timed it)."""

    def __init__(self, inner: Executable, whole: bool, runs: list[tuple[bool, int, set[str]]]
                 ) -> None:
        self.inner, self.whole, self.runs = inner, whole, runs
        self.target, self.inputs, self.outputs = inner.target, inner.inputs, inner.outputs

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        callers, frame = set(), sys._getframe(1)
        while frame is not None:
            callers |= {frame.f_code.co_name, frame.f_code.co_qualname}
            frame = frame.f_back
        self.runs.append((self.whole, id(inputs), callers))
        return self.inner.run(inputs)

    def close(self) -> None:
        self.inner.close()


class _TracedBackend(OnnxRuntimeBackend):
    """The real onnxruntime backend, its executables traced."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[tuple[bool, int, set[str]]] = []

    def compile(self, segment: Segment, target: Target) -> Executable:
        return _Traced(super().compile(segment, target), segment.is_whole, self.runs)


def test_a_whole_model_is_timed_as_its_plan_is_checked(mlp_path: Path) -> None:
    """A single-target plan is predicted by the profile's timing of that target's whole model
    and compared with the plan's own check: both are taken by one procedure (the plan's
    executor, time_plan's warm-up and median) on one feed, never the bare executable's
    lowest short median on another copy of the inputs."""
    backend = _TracedBackend()
    md = ModelDispatch("mlp", mlp_path, {"onnxruntime": backend}, [FP32],
                       DispatchOptions(runs=3, warmup=1, passes=2))
    plan = md.prepare()
    assert plan.segments == [(str(FP32), 0, len(plan.targets))]
    timers = {"median_ms", "time_plan"}
    timed = [(feed, callers) for whole, feed, callers in backend.runs
             if whole and callers & timers]
    profile = [(feed, callers) for feed, callers in timed if "table" in callers]
    check = [(feed, callers) for feed, callers in timed if "_build" in callers]
    assert profile and check
    for feed, callers in profile + check:
        assert callers & timers == {"time_plan"} and "CompiledPlan.run" in callers
        assert feed == id(md.calibration[0])
    assert md.builder is not None
    # the same figure, up to the rounding of two sums of the same layers in another order
    assert plan.predicted_ms == pytest.approx(md.builder.profile.extra["whole_ms"][str(FP32)],
                                              rel=1e-12)
    # the CPU those runs took (every thread of the process), kept with the profile: what
    # bench compares with its own runs' to tell the work from the parallelism it got
    assert md.builder.profile.extra["whole_cpu_ms"][str(FP32)] > 0


def test_a_precision_recipe_that_changes_nothing_is_not_timed_again(
        tmp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    """int4 quantizes MatMuls only: a convolution's int4 session is the fp32 one byte for byte.
    Its cells (and whole model) carry the fp32 figures, named, instead of a second timing of
    the same kernel on the same device; across the two passes too."""
    path = tmp_path / "cnn.onnx"
    onnx_gen.small_cnn(path, size=32, channels=(8, 16))
    part = partition(path)
    table = Measurer(part, {"onnxruntime": ort_backend}, [FP32, INT4], FP32,
                     onnx_gen.sample_inputs(path, count=2), runs=3, warmup=1, passes=2).table()
    twins = [row[str(INT4)] for row in table.cells if row[str(INT4)].same_as]
    assert twins and len(twins) >= len(table.cells) - 1  # every conv layer at least
    for row in table.cells:
        cell = row[str(INT4)]
        if cell.same_as:
            assert cell.same_as == str(FP32) and cell.error == row[str(FP32)].error == 0
            assert cell.ms == row[str(FP32)].ms  # the second pass's lower median included
    assert table.overhead_ms[str(INT4)] == table.overhead_ms[str(FP32)]
    again = LatencyTable.from_dict(table.as_dict())
    assert [r[str(INT4)].same_as for r in again.cells] == [r[str(INT4)].same_as
                                                          for r in table.cells]


def test_an_int8_variant_the_quantizer_left_unchanged_is_the_fp32_twin(
        tmp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    """The dynamic int8 quantizer leaves If/Loop bodies alone: a Silero VAD whose LSTM sits in
    an ``If`` came back op for op the same, its bytes rewritten, and was timed and served as
    ``int8`` doing fp32 work. Such a variant is the fp32 bytes, so a twin; a graph the
    quantizer does change (a MatMul on constant weights) still gets its int8 model."""
    import onnx
    from onnx import TensorProto, helper

    from edgepilot.backends.onnxrt_variants import VariantCache, model_bytes

    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 16], np.random.default_rng(0)
                           .standard_normal(256).astype(np.float32).tolist())
    body = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["z"])], "then", [],
                             [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 16])])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "else", [],
                              [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 16])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["h"], then_branch=body, else_branch=other),
             helper.make_node("Sigmoid", ["h"], ["y"])]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    graph = helper.make_graph(nodes, "gated", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 16])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 16])], [w, zero])
    gated = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              ir_version=8)
    cache = VariantCache(None, "test")
    assert cache.get(gated, "int8-dynamic") == model_bytes(gated)
    flat = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "flat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [w]),
        opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    assert "MatMulInteger" in {n.op_type for n in onnx.load_from_string(
        cache.get(flat, "int8-dynamic")).graph.node}
    # planned: the int8 whole model is the fp32 one's twin, carrying its figures
    path = tmp_path / "gated.onnx"
    onnx.save(gated, str(path))
    table = Measurer(partition(path), {"onnxruntime": ort_backend}, [FP32, INT8], FP32,
                     onnx_gen.sample_inputs(path, count=2), runs=3, warmup=1).table()
    assert table.extra["whole_twins"] == {str(INT8): str(FP32)}


def test_reference_tensors_kept_for_planning_do_not_hold_session_arenas(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    # an onnxruntime output is a view into its session's arena (a capsule as its base) and
    # keeps the whole arena alive: planning Kokoro TTS held 4.7 GB of closed sessions' arenas
    # through the boundary tensors it keeps
    part = partition(mlp_path)
    prof = Measurer(part, {"onnxruntime": ort_backend}, [FP32], FP32,
                    onnx_gen.sample_inputs(mlp_path, count=2), runs=3, warmup=1)
    exe = prof.compile(0, 1, FP32)
    raw = exe.run(prof.calibration[0])
    assert any(not v.flags.owndata for v in raw.values())  # what would be kept otherwise
    envs = prof.reference_envs()
    assert len(envs) == 2
    kept = [v for env in envs for k, v in env.items() if k not in prof.calibration[0]]
    assert kept and all(v.flags.owndata and v.base is None for v in kept)
