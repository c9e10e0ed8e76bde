"""The kernel corpus: fits recover known cost functions, the cache key invalidates, and the
held-out prediction of a layer never reads that layer's own measurement."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import dispatch_fixtures
import pytest

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.graph.partition import partition
from edgepilot.dispatch.measuring.cells import Cell, LatencyTable
from edgepilot.dispatch.planning.corpus import CorpusStore, KernelSpec, default_sweep, layer_ops
from edgepilot.dispatch.planning.kernels import (
    KernelPoint,
    OpFeatures,
    correction,
    fit_family,
    fit_model,
)
from edgepilot.dispatch.planning.plan import CostBuilder

mlp_path = dispatch_fixtures.mlp_path
ort_backend = dispatch_fixtures.ort_backend
FP32 = Target("onnxruntime", "cpu", "fp32")
INT8 = Target("onnxruntime", "cpu", "int8")
TINY = [KernelSpec("Call", (1, 16)), KernelSpec("MatMul", (4, 64, 64)),
        KernelSpec("MatMul", (4, 256, 64)), KernelSpec("Relu", (4, 512))]


def matmul(m: int, k: int, n: int) -> OpFeatures:
    return OpFeatures("MatMul", 2.0 * m * k * n, 4.0 * k * n, 4.0 * m * k, 4.0 * m * n)


def known_cost(f: OpFeatures) -> float:
    return 0.002 + 3e-8 * f.flops + 2e-8 * f.weight_bytes + 5e-9 * (f.in_bytes + f.out_bytes)


def test_fit_recovers_a_known_additive_cost_exactly_off_the_sweep() -> None:
    sweep = [matmul(m, k, n) for m, k, n in itertools.product((1, 8, 64), (64, 512, 2048),
                                                              (64, 512, 2048))]
    fit = fit_family([KernelPoint(f"k{i}", f, known_cost(f)) for i, f in enumerate(sweep)])
    for f in (matmul(4, 256, 1024), matmul(32, 100, 3000), matmul(128, 2048, 64)):
        assert fit.predict(f) == pytest.approx(known_cost(f), rel=1e-6)


def test_fit_reproduces_every_sweep_point_of_a_non_additive_cost() -> None:
    sweep = [matmul(m, k, n) for m, k, n in itertools.product((1, 16), (64, 1024), (64, 1024))]
    # efficiency that grows with size: no additive model fits it, the interpolation must
    points = [KernelPoint(f"k{i}", f, 1e-3 + f.flops ** 0.8 * 1e-7)
              for i, f in enumerate(sweep)]
    fit = fit_family(points)
    for p in points:
        assert fit.predict(p.features) == pytest.approx(p.ms, rel=1e-9)
    model = fit_model("t", 0.004, points)
    both = [points[0].features, points[3].features]
    assert model.layer_ms(both) == pytest.approx(0.004 + points[0].ms + points[3].ms)
    assert model.layer_ms([OpFeatures("Conv", 1, 1, 1, 1)]) is None  # no Conv in the corpus


def test_cache_key_changes_with_board_profile_runtime_and_sweep(tmp_path: Path) -> None:
    base = CorpusStore(tmp_path, {"board": "orin", "profile": "balanced"}, TINY)
    key = base.key(FP32, "1.32.0")
    assert key == CorpusStore(tmp_path, {"board": "orin", "profile": "balanced"}, TINY).key(
        FP32, "1.32.0")
    others = [base.key(FP32, "1.33.0"), base.key(INT8, "1.32.0"),
              CorpusStore(tmp_path, {"board": "rk3588", "profile": "balanced"}, TINY).key(
                  FP32, "1.32.0"),
              CorpusStore(tmp_path, {"board": "orin", "profile": "powersave"}, TINY).key(
                  FP32, "1.32.0"),
              CorpusStore(tmp_path, {"board": "orin", "profile": "balanced"}, TINY[:3]).key(
                  FP32, "1.32.0")]
    assert len({key, *others}) == 6


def test_corpus_is_measured_once_then_loaded_and_remeasured_for_another_board(
        tmp_path: Path, ort_backend: OnnxRuntimeBackend) -> None:
    backends = {"onnxruntime": ort_backend}
    store = CorpusStore(tmp_path / "corpus", {"board": "orin"}, TINY, runs=3, warmup=1,
                        passes=1)
    models = store.for_targets(backends, [FP32])
    assert store.measured == [str(FP32)]
    files = list((tmp_path / "corpus").glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert {p["kernel"] for p in data["points"]} == {"MatMul_4x64x64", "MatMul_4x256x64",
                                                     "Relu_4x512"}
    assert data["call_ms"] > 0
    assert set(models[str(FP32)].fits) == {"MatMul", "Relu"}

    again = CorpusStore(tmp_path / "corpus", {"board": "orin"}, TINY, runs=3, warmup=1,
                        passes=1)
    loaded = again.for_targets(backends, [FP32])
    assert again.measured == []                       # from the cache, nothing timed
    assert loaded[str(FP32)].call_ms == models[str(FP32)].call_ms

    moved = CorpusStore(tmp_path / "corpus", {"board": "rk3588"}, TINY, runs=3, warmup=1,
                        passes=1)
    moved.for_targets(backends, [FP32])
    assert moved.measured == [str(FP32)]
    assert len(list((tmp_path / "corpus").glob("*.json"))) == 2


def test_every_model_operator_has_a_swept_family() -> None:
    swept = {s.op for s in default_sweep()}
    assert {"MatMul", "MatMulAct", "Conv", "Add", "AddBias", "Relu", "Softmax",
            "LayerNormalization", "Transpose", "MaxPool", "Mul"} <= swept


def test_held_out_prediction_never_reads_the_held_out_cell(mlp_path: Path) -> None:
    part = partition(mlp_path)
    n = len(part.layers)
    assert n >= 3
    target = str(FP32)
    ops = [f for i in range(n) for f in layer_ops(part, i)]
    # a corpus that knows every operator of the model exactly: 1e-8 ms per FLOP
    points = [KernelPoint(f"k{j}", f, 1e-8 * f.flops + 1e-4) for j, f in enumerate(ops)]
    kernels = {target: fit_model(target, 0.003, points)}

    def builder(ms: list[float]) -> CostBuilder:
        profile = LatencyTable([target], target, [{target: Cell(m, 0.0)} for m in ms],
                               {target: 0.0}, 1e6)
        return CostBuilder(part, profile, 0.05, kernels=kernels)

    ms = [0.05 * (i + 1) for i in range(n)]
    first = builder(ms)
    preds = [first.kernel_prediction(i, target) for i in range(n)]
    for held in range(n):
        changed = list(ms)
        changed[held] *= 7.0                     # only the held-out cell moves
        other = builder(changed)
        assert other.kernel_prediction(held, target) == pytest.approx(preds[held])
        moved = [i for i in range(n) if i != held
                 and other.kernel_prediction(i, target) != pytest.approx(preds[i])]
        assert moved                             # ... and the others do read it
    # the correction is the geometric mean of the other layers' measured/kernel-sum ratios
    sums = [first.kernel_sum(i, target) for i in range(n)]
    logs = [math.log(ms[j] / s) for j, s in enumerate(sums) if j != 0 and s is not None]
    assert correction(sums, ms, ["gemm"] * n, 0) == pytest.approx(
        math.exp(sum(logs) / len(logs)))
