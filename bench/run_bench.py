"""Benchmark the dispatcher on generated models: plan vs single targets, prediction accuracy.

Usage: .venv/bin/python bench/run_bench.py [--out bench/results.json] [--runs 30]

Generates the models into a temporary directory (deterministic seeds), plans each one with the
targets installed here, times plan / every single target / the raw runtime side by side
(edgepilot.dispatch.bench), and measures the roofline predictor by leave-one-out over every
profiled (layer, target) cell, pooled per target across models. Takes a minute or two.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from edgepilot.config import Config
from edgepilot.dispatch.bench import bench
from edgepilot.dispatch.costmodel import Sample, leave_one_out, leave_one_out_linear, op_class
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.models import onnx_gen
from edgepilot.models.tflite_gen import write_mlp_tflite


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench/results.json"))
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="edgepilot-bench-") as tmp:
        root = Path(tmp)
        models = make_models(root / "models")
        config = Config.model_validate({"daemon": {"state_dir": str(root / "state"),
                                                   "model_dir": str(root / "models")},
                                        "dispatch": {"profile_runs": 9, "warmup_runs": 2}})
        dispatcher = Dispatcher(config)
        results: dict[str, Any] = {"models": {}, "predictor": {}}
        pooled: dict[str, list[Sample]] = {}
        by_class: dict[str, list[Sample]] = {}
        for name, what in models.items():
            print(f"== {name}: {what}", file=sys.stderr)
            md = dispatcher.get(name)
            res = bench(md, runs=args.runs)
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
            print(json.dumps({k: res[k] for k in ("plan", "single", "raw",
                                                  "speedup_vs_best_single",
                                                  "predicted_vs_measured")}), file=sys.stderr)
        total_hits = total = 0
        for target, samples in sorted(pooled.items()):
            hits, count, errors = leave_one_out(samples)
            total_hits += hits
            total += count
            results["predictor"][target] = {
                "layers": count, "within_10pct": hits,
                "median_abs_error": sorted(abs(e) for e in errors)[len(errors) // 2]
                if errors else None}
        results["predictor_overall"] = {"layers": total, "within_10pct": total_hits}
        # the daemon's predictor: additive NNLS fit per (target, op class), terms chosen by
        # inner leave-one-out; the held-out layer is never part of any fit or choice
        hits_c = total_c = 0
        results["predictor_by_op_class"] = {}
        for key, samples in sorted(by_class.items()):
            hits, count, errors = leave_one_out_linear(samples)
            hits_c += hits
            total_c += count
            results["predictor_by_op_class"][key] = {
                "layers": count, "within_10pct": hits,
                "median_abs_error": sorted(abs(e) for e in errors)[len(errors) // 2]
                if errors else None}
        results["predictor_by_op_class_overall"] = {"layers": total_c, "within_10pct": hits_c}
        print(json.dumps({"roofline_per_target": results["predictor_overall"],
                          "linear_per_target_op_class":
                          results["predictor_by_op_class_overall"]}), file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
