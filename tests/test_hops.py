"""Hops are charged by kind: measured at the cut a plan makes, on the real runtimes, and the
planner chooses again on what they cost."""

from __future__ import annotations

from pathlib import Path

import dispatch_fixtures
import pytest

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.graph.partition import Partition, partition
from edgepilot.dispatch.measuring.cells import Cell, LatencyTable
from edgepilot.dispatch.measuring.hops import hop_kind, pair_costs
from edgepilot.dispatch.measuring.measure import Measurer
from edgepilot.dispatch.planning.choice import choose, measure_hops
from edgepilot.dispatch.planning.plan import CostBuilder
from edgepilot.dispatch.planning.planner import CostTable, solve
from edgepilot.formats import onnx_gen

mlp_path = dispatch_fixtures.mlp_path
ort_backend = dispatch_fixtures.ort_backend

FP32 = Target("onnxruntime", "cpu", "fp32")
INT8 = Target("onnxruntime", "cpu", "int8")


def test_kinds_name_runtime_and_device_and_fixed_costs_come_from_their_samples() -> None:
    assert hop_kind("onnxruntime/cpu/fp32", "onnxruntime/cpu/int8") == \
        "onnxruntime/cpu->onnxruntime/cpu"
    assert hop_kind("tflite/xnnpack/fp32", "armnn/CpuAcc/fp16") == "tflite/xnnpack->armnn/CpuAcc"
    targets = ["tflite/xnnpack/fp32", "armnn/CpuAcc/fp32", "armnn/CpuAcc/fp16"]
    bw = 1000.0  # bytes per ms
    samples = [
        {"kind": "tflite/xnnpack->armnn/CpuAcc", "bytes": 2000, "ms": 0.5},   # 2 ms copy
        {"kind": "tflite/xnnpack->armnn/CpuAcc", "bytes": 1000, "ms": 1.5},
        {"kind": "tflite/xnnpack->armnn/CpuAcc", "bytes": 0, "ms": 0.1},
        {"kind": "armnn/CpuAcc->tflite/xnnpack", "bytes": 500, "ms": None},   # not measurable
    ]
    pair = pair_costs(targets, samples, bw)
    assert pair is not None
    # median of (0.5 - 2, 1.5 - 1, 0.1 - 0) = 0.1 for every xnnpack -> CpuAcc pair
    assert pair[0][1] == pytest.approx(0.1) and pair[0][2] == pytest.approx(0.1)
    assert pair[1][0] == 0.0 and pair[1][1] == 0.0   # unmeasured kind; no hop within a target
    # two variants of one runtime are a kind of their own, not measured here
    assert pair[1][2] == 0.0
    assert pair_costs(targets, [], bw) is None
    assert pair_costs(targets, samples[3:], bw) is None


def test_the_direction_of_a_hop_is_its_own_cost_and_never_below_zero() -> None:
    # "gpu" is 1 ms faster on layers 1-2; coming back to "cpu" for layer 3 is what varies
    table = CostTable(["cpu", "gpu"], [[1.0, 3.0], [3.0, 2.0], [3.0, 2.0], [1.0, 1.5]],
                      enter_ms=[0.0, 0.0], hop_ms=[0.0, 0.2, 0.2, 0.2],
                      pair_ms=[[0.0, 0.1], [0.1, 0.0]])
    assert solve(table)[0] == [0, 1, 1, 0]
    assert table.hop(1, 0, 1) == pytest.approx(0.3) and table.hop(1, 1, 1) == 0.0
    table.pair_ms = [[0.0, 0.1], [5.0, 0.0]]  # the way back is dear: stay on gpu to the end
    assert solve(table)[0] == [0, 1, 1, 1]
    table.pair_ms = [[0.0, -1.0], [-1.0, 0.0]]  # cheaper than the copy: a hop costs 0, not less
    assert table.hop(2, 0, 1) == 0.0


def _split_profile(part: Partition) -> LatencyTable:
    """The MLP's layers as if int8 were far faster on its middle layers only: the planner splits
    fp32 | int8 | fp32 (int8 within tolerance everywhere: nothing but speed decides)."""
    n = len(part.layers)
    assert n >= 3
    fp32, int8 = str(FP32), str(INT8)
    cells = [{fp32: Cell(1.0, 0.0), int8: Cell(0.2 if 0 < i < n - 1 else 3.0, 0.01)}
             for i in range(n)]
    return LatencyTable([fp32, int8], fp32, cells, {fp32: 0.0, int8: 0.0}, 1e6,
                        extra={"whole_ms": {fp32: 1.0 * n, int8: 3.0 * n}})


def test_the_kinds_a_plan_makes_are_measured_on_the_real_runtime_where_it_cuts(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    part = partition(mlp_path)
    n = len(part.layers)
    measurer = Measurer(part, {"onnxruntime": ort_backend}, [FP32, INT8], FP32,
                        onnx_gen.sample_inputs(mlp_path, count=1), runs=3, warmup=1)
    builder = CostBuilder(part, _split_profile(part), 0.05, split_margin=0.0)
    seen: list[str] = []
    assert measure_hops(builder, measurer.hop, lambda d, t, what: seen.append(what)) == 1
    # fp32 -> int8 and int8 -> fp32 are one kind (same runtime, same device): measured once,
    # at the first cut the plan makes
    samples = builder.profile.extra["hops"]
    assert [(s["kind"], s["from"], s["to"], s["layer"]) for s in samples] == [
        ("onnxruntime/cpu->onnxruntime/cpu", str(FP32), str(INT8), 1)]
    assert samples[0]["bytes"] == part.boundary_bytes(1) > 0
    ms = samples[0]["ms"]
    assert isinstance(ms, float) and abs(ms) < 50.0
    assert seen == ["hop onnxruntime/cpu->onnxruntime/cpu before layer 1"]
    # the plan charges every cut of that kind what was measured, scaled by its bytes
    bw = builder.profile.bandwidth_bytes_per_ms
    fixed = ms - samples[0]["bytes"] / bw
    plan = choose("mlp", builder)
    assert plan.segments == [(str(FP32), 0, 1), (str(INT8), 1, n - 1), (str(FP32), n - 1, n)]
    assert [(h["layer"], h["kind"]) for h in plan.hops] == [
        (1, "onnxruntime/cpu->onnxruntime/cpu"), (n - 1, "onnxruntime/cpu->onnxruntime/cpu")]
    for h in plan.hops:
        assert h["predicted_ms"] == pytest.approx(max(0.0, fixed + h["bytes"] / bw), abs=1e-4)
    # kept with the profile: a restart from the cache charges the same without measuring
    again = CostBuilder(part, LatencyTable.from_dict(builder.profile.as_dict()), 0.05,
                        split_margin=0.0)
    assert again.table().pair_ms == builder.table().pair_ms
    assert measure_hops(again, measurer.hop) == 0
    # a cut no runtime here can compile is recorded as unmeasurable, not retried
    assert measurer.hop(str(FP32), "nosuch/cpu/fp32", 1) is None


def test_a_dear_kind_of_hop_sends_the_planner_back_to_one_target(
        mlp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    """A hop kind that costs 40 ms more than this machine's (a bus no board here has), measured
    at the first cut: the next choice makes no hop, and nothing more is measured."""
    part = partition(mlp_path)
    measurer = Measurer(part, {"onnxruntime": ort_backend}, [FP32, INT8], FP32,
                        onnx_gen.sample_inputs(mlp_path, count=1), runs=3, warmup=1)
    builder = CostBuilder(part, _split_profile(part), 0.05, split_margin=0.0)
    calls: list[tuple[str, str, int]] = []

    def slow_bus(src: str, dst: str, cut: int) -> float | None:
        calls.append((src, dst, cut))
        ms = measurer.hop(src, dst, cut)
        return None if ms is None else ms + 40.0

    assert measure_hops(builder, slow_bus) == 1
    assert calls == [(str(FP32), str(INT8), 1)]
    plan = choose("mlp", builder)
    assert plan.segments == [(str(FP32), 0, len(part.layers))] and plan.hops == []
