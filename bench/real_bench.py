"""Benchmark the dispatcher on the real-model corpus: plan vs every single target vs raw runtime.

Usage: .venv/bin/python bench/real_bench.py [--out bench/real_results.json] [--runs 30]
       [--budget-s 0.3] [--state-dir DIR] [--only NAME[,NAME]] [--manifest FILE --root DIR]

For every model of ``tests/real_models.py`` (exported files shipped in registry packages), at
its corpus input shapes: plan it with every target installed here (like ``edgepilot plan``),
then time the plan, every single-target plan and the raw runtime on the same file side by side
(``edgepilot.dispatch.bench``: interleaved rounds, paired ratios). Also reported per model:
whether layers differ in their best target at all (and the most a split could gain if hops were
free: the best single target's layer sum over the sum of every layer's best cell), and the plan
predicted vs measured. Plans and profiles are cached in the state dir (default
``~/.cache/edgepilot-bench``); ``--reprofile`` measures again.

``--manifest`` benches other files instead of the corpus (held-out ones, a user's): a JSON list
of ``{"name", "path", "what", "input_shapes"}``, each ``path`` relative to ``--root``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from real_models import CORPUS, UNRUNNABLE, RealModel

from edgepilot.config import Config
from edgepilot.dispatch.bench import bench
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.model_dispatch import ModelDispatch
from edgepilot.errors import EdgepilotError


@dataclass(frozen=True)
class Listed:
    """A file of a ``--manifest``: what :func:`run_one` reads of a corpus entry."""

    name: str
    path: Path
    what: str
    input_shapes: dict[str, list[int]] = field(default_factory=dict)


def listed(manifest: Path, root: Path) -> list[Listed]:
    """The entries of a ``--manifest`` file, their paths under ``root``."""
    return [Listed(e["name"], root / e["path"], e.get("what", ""), e.get("input_shapes", {}))
            for e in json.loads(manifest.read_text())]


def split_potential(md: ModelDispatch) -> dict[str, Any]:
    """Do layers differ in their best eligible target, and what could a free split gain?"""
    assert md.builder is not None
    profile = md.builder.profile
    tol = md.opts.tolerance
    rows = profile.cells
    eligible = [{t: c.ms for t, c in row.items()
                 if c.ms is not None and (c.error or 0.0) <= tol} for row in rows]
    bests = [min(row, key=lambda t: row[t]) if row else None for row in eligible]
    sums = {t: sum(row.get(t) or float("inf") for row in eligible) for t in profile.targets}
    single = min(sums.values()) if sums else float("inf")
    ideal = sum(min(row.values()) for row in eligible if row)
    return {"layers": len(rows), "best_targets": sorted({b for b in bests if b}),
            "layers_differ": len({b for b in bests if b}) > 1,
            "free_split_gain": round(single / ideal, 3) if ideal and single < float("inf")
            else None}


def run_one(config: Config, model: RealModel | Listed, runs: int, budget_s: float,
            reprofile: bool, compiles: int | None = None) -> dict[str, Any]:
    dispatcher = Dispatcher(config)
    shapes = {k: tuple(v) for k, v in model.input_shapes.items()} or None
    md = dispatcher.get(str(model.path), shapes)
    assert isinstance(md, ModelDispatch)
    t0 = time.perf_counter()
    md.prepare(reprofile=reprofile)
    plan_s = time.perf_counter() - t0
    try:
        result = bench(md, runs=runs, budget_s=budget_s, compiles=compiles)
    finally:
        # each model as in a process of its own: its sessions (and their thread pools) closed
        # now, not whenever a garbage collection finds their cycles (two-thread sessions ran
        # 35% slower late in a 30-model run than alone, with 40% more CPU a call)
        if md.compiled is not None:
            md.compiled.close()
        gc.collect()
    result["model"] = model.name
    result["what"] = model.what
    result["signature"] = md.signature
    result["plan_s"] = round(plan_s, 1)
    assert md.plan is not None
    result["planning_s"] = md.plan.planning_s
    result["reason"] = md.plan.reason
    result["versus_single"] = md.plan.versus_single
    result["exclusions"] = len(md.plan.exclusions)
    result["split"] = split_potential(md)
    raw = result.get("raw")
    result["plan_vs_raw_paired"] = result["paired_ratio"].get("raw") if raw else None
    return result


def table(results: list[dict[str, Any]]) -> str:
    head = ("| model | planned: segments (or why not) | plan ms | best single within tolerance "
            "| vs best (paired) | vs raw (paired) | predicted / measured | planning s |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | not planned: {r['error']} | | | | | | |")
            continue
        segs = " → ".join(r["plan"]["targets"])
        if r.get("reason", "").startswith("single target"):
            segs += " (split measured slower: single target kept)"
        best = r.get("best_single") or "-"
        best_ms = r["single"][best]["median_ms"] if best in r["single"] else None
        lines.append(
            f"| {r['model']} | {len(r['plan']['targets'])}: {segs} | "
            f"{r['plan']['median_ms']:.3f} | {best} "
            f"{best_ms if best_ms is not None else '-'} ms | "
            f"{r['speedup_vs_best_single_paired']} | {r['plan_vs_raw_paired']} | "
            f"{r['predicted_vs_measured']} | {r.get('planning_s')} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "real_results.json"))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=0.3)
    ap.add_argument("--state-dir", default=str(Path.home() / ".cache" / "edgepilot-bench"))
    ap.add_argument("--only", default="", help="comma-separated corpus names")
    ap.add_argument("--reprofile", action="store_true")
    ap.add_argument("--compiles", type=int, default=None,
                    help="fresh compiles of each variant the rounds rotate through "
                         "(default: the bench's, 4 or 8 for a light plan)")
    ap.add_argument("--manifest", help="a JSON list of files to bench instead of the corpus")
    ap.add_argument("--root", default=".", help="the folder --manifest's paths are under")
    args = ap.parse_args()
    only = {n for n in args.only.split(",") if n}
    config = Config.model_validate({"daemon": {"state_dir": args.state_dir,
                                               "demo_models": False}})
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    models: list[RealModel | Listed] = listed(Path(args.manifest), Path(args.root)) \
        if args.manifest else [*CORPUS, *UNRUNNABLE]
    for model in models:
        if only and model.name not in only:
            continue
        print(f"== {model.name}: {model.what}", file=sys.stderr, flush=True)
        try:
            results.append(run_one(config, model, args.runs, args.budget_s, args.reprofile,
                                   args.compiles))
        except EdgepilotError as exc:  # the one-line reason the CLI prints
            results.append({"model": model.name, "error": exc.message})
        except Exception as exc:  # report every model, met or not
            results.append({"model": model.name, "error": f"{type(exc).__name__}: {exc}"})
        print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    out = {"seconds": round(time.perf_counter() - started, 1), "results": results}
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print(table(results))
    print(f"\n{len(results)} models in {out['seconds']} s; full results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
