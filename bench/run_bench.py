"""Benchmark the dispatcher on generated models: plan vs single targets, prediction accuracy.

Usage: .venv/bin/python bench/run_bench.py [--out bench/results.json] [--runs 30]
       [--budget-s 0.3] [--state-dir DIR]

Generates the models into a temporary directory (deterministic seeds), plans each one with the
targets installed here, times plan / every single target / the raw runtime side by side
(edgepilot.dispatch.bench), and scores the layer predictors by leave-one-out over every
profiled (layer, target) cell: the kernel-corpus predictor (the daemon's), the additive fit per
(target, op class) and the roofline per target, next to the noise floor (every cell profiled a
second time, the same way). The kernel corpus is cached in the state dir (default
``~/.cache/edgepilot-bench``), so only the first run measures it. About a minute.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from edgepilot.config import Config
from edgepilot.dispatch.bench import bench
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.measuring.measure import Measurer
from edgepilot.dispatch.planning.costmodel import (
    Sample,
    leave_one_out,
    leave_one_out_linear,
    op_class,
    within,
)
from edgepilot.dispatch.planning.kernels import correction
from edgepilot.dispatch.planning.plan import CostBuilder
from edgepilot.dispatch.targets import available_targets
from edgepilot.formats import onnx_gen
from edgepilot.formats.tflite_gen import write_mlp_tflite


def make_models(d: Path) -> dict[str, str]:
    """name -> what it is."""
    onnx_gen.transformer_stack(d / "transformer.onnx")
    onnx_gen.small_cnn(d / "cnn_head.onnx", size=32, channels=(16, 32), head=(2048, 2048),
                       batch=4)
    onnx_gen.mlp_stack(d / "mlp_mix.onnx", widths=(512, 64, 2048, 2048, 64, 512), batch=4)
    onnx_gen.small_cnn(d / "cnn.onnx")
    write_mlp_tflite(d / "mlp_tflite.tflite", width=512, depth=4, batch=8)
    onnx_gen.mlp_stack(d / "mlp_wide.onnx", widths=(256, 512, 1024, 256, 2048, 128, 768, 512),
                       batch=4)
    return {
        "transformer": "4 pre-norm blocks, d=256, seq=64, FFN 128/2048 alternating",
        "cnn_head": "2 conv stages (16, 32 ch, 32x32) + dense head 2048x2048, batch 4",
        "mlp_mix": "MLP 512-64-2048-2048-64-512, batch 4 (small and large MatMuls)",
        "cnn": "3 conv stages (16/32/64 ch, 64x64) + Gemm",
        "mlp_tflite": "TFLite FC stack 512 wide x4 + residual, batch 8",
        "mlp_wide": "MLP 256-512-1024-256-2048-128-768-512, batch 4 (7 GEMMs of varied size)",
    }


def _by_target(pairs: list[tuple[str, float, float]]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for target, a, b in pairs:
        out.setdefault(target, []).append((a, b))
    return out


def kernel_held_out(builder: CostBuilder, target: str, measured: list[float | None]
                    ) -> list[tuple[float, float]]:
    """(prediction, measurement) of every measured layer on ``target``: kernel sum times the
    correction fitted on the model's *other* layers (``kernels.correction``)."""
    sums = [builder.kernel_sum(i, target) for i in range(len(builder.part.layers))]
    classes = [op_class(lay.op_types) for lay in builder.part.layers]
    out = []
    for i, (ks, ms) in enumerate(zip(sums, measured, strict=True)):
        if ks is not None and ms is not None:
            out.append((ks * correction(sums, measured, classes, i), ms))
    return out


def _score(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    errs = sorted(abs(p - m) / m for p, m in pairs)
    return {"layers": len(pairs), "within_10pct": sum(within(p, m) for p, m in pairs),
            "median_abs_error": errs[len(errs) // 2] if errs else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench/results.json"))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=0.3)
    ap.add_argument("--state-dir", type=Path, default=Path.home() / ".cache" / "edgepilot-bench",
                    help="where the kernel corpus is cached between runs")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edgepilot-bench-") as tmp:
        root = Path(tmp)
        models = make_models(root / "models")
        # plans and quantized variants are per run (temporary); the corpus is kept
        config = Config.model_validate({"daemon": {"state_dir": str(root / "state"),
                                                   "model_dir": str(root / "models")},
                                        "dispatch": {"profile_runs": 9, "warmup_runs": 2}})
        dispatcher = Dispatcher(config)
        corpus = dispatcher.corpora.store(dispatcher.corpus_parts())
        corpus.directory = args.state_dir / "corpus"
        # plans do not wait for the corpus (the daemon measures it after one): measured first
        # here, as the kernel predictor is what this bench scores
        dispatcher.kernel_models(available_targets(dispatcher.backends,
                                                   config.dispatch.targets))
        dispatcher.corpora.measure_wanted(dispatcher.backends, None)
        results: dict[str, Any] = {"models": {}, "predictor": {}}
        kernel_pairs: dict[str, list[tuple[float, float]]] = {}
        kernel_pairs_avg: list[tuple[float, float]] = []
        pooled: dict[str, list[Sample]] = {}
        by_class: dict[str, list[Sample]] = {}
        by_class_avg: dict[str, list[Sample]] = {}
        pairs: list[tuple[str, float, float]] = []   # (target, run 1 ms, run 2 ms) per cell
        for name, what in models.items():
            print(f"== {name}: {what}", file=sys.stderr)
            md = dispatcher.get(name)
            res = bench(md, runs=args.runs, budget_s=args.budget_s)
            res["what"] = what
            res["plan_detail"] = md.explain()
            results["models"][name] = res
            assert md.builder is not None
            for target in md.builder.profile.targets:
                samples = md.builder.samples(target)
                pooled.setdefault(target, []).extend(samples)
                measured = [lay for lay, row in zip(md.builder.part.layers,
                                                    md.builder.profile.cells, strict=True)
                            if row[target].ms is not None]
                for lay, sample in zip(measured, samples, strict=True):
                    by_class.setdefault(f"{target} {op_class(lay.op_types)}", []).append(sample)
            # the noise floor: the same layers timed again, independently, the same way
            again = Measurer(md.part, md.backends, md.targets, md.reference, md.calibration,
                             runs=md.opts.runs, warmup=md.opts.warmup,
                             metric=md.opts.metric, passes=md.opts.passes).table()
            b = md.builder
            for target in b.kernels:
                first = [row[target].ms for row in b.profile.cells]
                second = [row[target].ms for row in again.cells]
                key = f"{target} " + "/".join(sorted({op_class(lay.op_types)
                                                      for lay in b.part.layers}))
                kernel_pairs.setdefault(target, []).extend(kernel_held_out(b, target, first))
                results["models"][name].setdefault("kernel_held_out", {})[key] = _score(
                    kernel_held_out(b, target, first))
                avg = [math.sqrt(x * y) if x is not None and y is not None else None
                       for x, y in zip(first, second, strict=True)]
                kernel_pairs_avg.extend(kernel_held_out(b, target, avg))
            for layer, row1, row2 in zip(md.part.layers, md.builder.profile.cells, again.cells,
                                         strict=True):
                for target, c1 in row1.items():
                    c2 = row2.get(target)
                    if c1.ms is None or c2 is None or c2.ms is None:
                        continue
                    pairs.append((target, c1.ms, c2.ms))
                    prec = target.split("/")[-1]
                    avg = CostBuilder.sample(layer, prec, math.sqrt(c1.ms * c2.ms))
                    by_class_avg.setdefault(f"{target} {op_class(layer.op_types)}",
                                            []).append(avg)
            print(json.dumps({k: res[k] for k in ("plan", "single", "raw",
                                                  "speedup_vs_best_single_paired",
                                                  "predicted_vs_measured", "plan_time")}),
                  file=sys.stderr)
        results["predictor"], results["predictor_overall"] = _loo_scores(pooled, leave_one_out)
        # the round-2 predictor: additive NNLS fit per (target, op class), terms chosen by
        # inner leave-one-out; the held-out layer is never part of any fit or choice
        results["predictor_by_op_class"], results["predictor_by_op_class_overall"] = \
            _loo_scores(by_class, leave_one_out_linear)
        # the same predictor fitted/evaluated on the geometric mean of the two timing runs
        _, results["predictor_two_runs_overall"] = _loo_scores(by_class_avg,
                                                               leave_one_out_linear)
        # the daemon's predictor: kernel corpus x correction from the model's other layers
        results["kernel_predictor"] = {t: _score(v) for t, v in sorted(kernel_pairs.items())}
        results["kernel_predictor_overall"] = _score(
            [pair for v in kernel_pairs.values() for pair in v])
        results["kernel_predictor_two_runs_overall"] = _score(kernel_pairs_avg)
        results["corpus"] = {"measured": corpus.measured,
                             "seconds": round(corpus.seconds, 1),
                             "kernels_per_target": len(corpus.specs),
                             "passes": corpus.passes}
        agree = sum(within(b, a) for _, a, b in pairs)
        results["noise_floor"] = {
            "cells": len(pairs), "within_10pct": agree,
            "median_abs_diff": statistics.median(abs(b - a) / a for _, a, b in pairs)
            if pairs else None,
            "by_target": {t: {"cells": len(v), "within_10pct": sum(within(b, a) for a, b in v)}
                          for t, v in _by_target(pairs).items()}}
        results["bench_seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps({"kernel_corpus": results["kernel_predictor_overall"],
                          "kernel_corpus_two_runs": results["kernel_predictor_two_runs_overall"],
                          "corpus": results["corpus"],
                          "bench_seconds": results["bench_seconds"],
                          "roofline_per_target": results["predictor_overall"],
                          "linear_per_target_op_class":
                          results["predictor_by_op_class_overall"],
                          "linear_two_runs": results["predictor_two_runs_overall"],
                          "noise_floor": {k: results["noise_floor"][k]
                                          for k in ("cells", "within_10pct")}}),
              file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _loo_scores(groups: dict[Any, Any], score: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """Leave-one-out ``score`` per group and pooled: hits within ±10%, count, median |error|."""
    per: dict[str, Any] = {}
    hits_all = count_all = 0
    for key, samples in sorted(groups.items()):
        hits, count, errors = score(samples)
        hits_all += hits
        count_all += count
        per[str(key)] = {"layers": count, "within_10pct": hits,
                         "median_abs_error": sorted(abs(e) for e in errors)[len(errors) // 2]
                         if errors else None}
    return per, {"layers": count_all, "within_10pct": hits_all}

if __name__ == "__main__":
    raise SystemExit(main())
