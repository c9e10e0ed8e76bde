"""Measurer on real onnxruntime targets: latency, error vs fp32, unsupported cells, hops."""

from __future__ import annotations

from pathlib import Path

import dispatch_fixtures

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.graph.partition import partition
from edgepilot.dispatch.measuring.measure import LatencyTable, Measurer
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
