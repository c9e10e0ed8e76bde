"""Which (layer, target) cells the planner may use: per-layer error against the whole model's."""

from __future__ import annotations

from pathlib import Path

import dispatch_fixtures

from edgepilot.dispatch.graph.partition import partition
from edgepilot.dispatch.measuring.cells import Cell, LatencyTable
from edgepilot.dispatch.planning.plan import CostBuilder

mlp_path = dispatch_fixtures.mlp_path
FP32, INT8 = "onnxruntime/cpu/fp32", "onnxruntime/cpu/int8"


def builder(path: Path, layer_error: float, whole_error: float | None) -> CostBuilder:
    part = partition(path)
    cells = [{FP32: Cell(1.0, 0.0), INT8: Cell(0.3, layer_error)} for _ in part.layers]
    extra = {"whole_ms": {FP32: 1.0 * len(cells), INT8: 0.3 * len(cells)}}
    if whole_error is not None:
        extra["whole_error"] = {FP32: 0.0, INT8: whole_error}
    profile = LatencyTable([FP32, INT8], FP32, cells, {FP32: 0.0, INT8: 0.0}, 1e6, extra=extra)
    return CostBuilder(part, profile, 0.05)


def test_a_layer_over_tolerance_is_not_eligible_when_the_whole_model_is_not_either(
        mlp_path: Path) -> None:
    b = builder(mlp_path, layer_error=0.09, whole_error=0.2)
    assert not any(b.eligible(i, INT8) for i in range(len(b.part.layers)))
    assert set(b.best()[0]) == {b.table().targets.index(FP32)}
    # a profile cached before whole-model errors were kept: per-layer errors decide alone
    old = builder(mlp_path, layer_error=0.09, whole_error=None)
    assert not old.eligible(0, INT8)


def test_a_target_whose_whole_model_is_within_tolerance_stays_eligible_per_layer(
        mlp_path: Path) -> None:
    """Errors measured on a layer's own outputs (a residual sum before its LayerNorm) can look
    far larger than what reaches the output; the whole model's error says what does."""
    b = builder(mlp_path, layer_error=0.09, whole_error=0.014)
    assert all(b.eligible(i, INT8) for i in range(len(b.part.layers)))
    assert set(b.best()[0]) == {b.table().targets.index(INT8)}
    # a layer the repair pinned to the reference stays there
    b.forced[0] = FP32
    assert not b.eligible(0, INT8) and b.eligible(1, INT8)


def test_a_variant_layer_computing_what_the_reference_does_costs_what_it_costs(
        mlp_path: Path) -> None:
    """int4 leaves every layer but the MatMuls as fp32 computes it (error exactly 0): a lower
    timing of one computation on one target is noise, so both targets get the lower one and
    the variant is chosen only for what it changed."""
    part = partition(mlp_path)
    n = len(part.layers)
    int4 = "onnxruntime/cpu/int4"
    # int4 "measured" 30% faster on every layer, but changed only the last one, a small one
    cells = [{FP32: Cell(1.0, 0.0), int4: Cell(0.7, 0.0)} for _ in range(n - 1)]
    cells.append({FP32: Cell(0.05, 0.0), int4: Cell(0.035, 0.01)})
    profile = LatencyTable([FP32, int4], FP32, cells, {FP32: 0.0, int4: 0.0}, 1e6,
                           extra={"whole_ms": {FP32: 1.0 * n, int4: 0.7 * n}})
    b = CostBuilder(part, profile, 0.05)
    assert [b.layer_ms(i, FP32) for i in range(n - 1)] == [0.7] * (n - 1)
    assert b.layer_ms(n - 1, FP32) == 0.05 and b.layer_ms(n - 1, int4) == 0.035
    assign, _, table = b.best()
    assert {table.targets[t] for t in assign} == {FP32}  # within the margin: the reference
    # a variant that changed every layer (error > 0) keeps its own timings and wins
    for row in cells:
        row[int4] = Cell(0.7 * (row[FP32].ms or 0.0), 0.01)
    b = CostBuilder(part, profile, 0.05)
    assert b.layer_ms(0, FP32) == 1.0
    assign, _, table = b.best()
    assert {table.targets[t] for t in assign} == {int4}
