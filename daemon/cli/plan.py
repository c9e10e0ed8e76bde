"""``edgepilot plan MODEL [--json]`` and ``edgepilot bench MODEL [--json]``.

MODEL is a configured model name, a file stem in ``--model-dir`` or a path. Profiles are cached
in ``--state-dir``, so a second ``plan`` of an unchanged model on the same board is instant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from edgepilot.cli.common import config_from
from edgepilot.config import Config
from edgepilot.dispatch.measuring.contention import CONTENDED


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="show a model's per-layer plan (profiling it if needed)")
    p.add_argument("model", help="model name, file stem in --model-dir, or path")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--reprofile", action="store_true", help="measure again, ignore the cache")
    add_shape_flag(p)
    p.set_defaults(func=cmd_plan)
    b = sub.add_parser("bench", help="time the plan against every single target, side by side")
    b.add_argument("model", help="model name, file stem in --model-dir, or path")
    b.add_argument("--json", action="store_true", help="machine-readable output")
    b.add_argument("--runs", type=int, default=30, help="fewest timed rounds (default 30)")
    b.add_argument("--budget-s", type=float, default=0.3,
                   help="timed seconds every variant gets at least (default 0.3, 0..60)")
    b.add_argument("--compiles", type=int, default=None,
                   help="fresh compiles of each variant, rotated between rounds: averages out "
                        "one session's offset (default 4, 8 for a plan under 1 ms a call; "
                        "fewer where memory is short; 1..8)")
    add_shape_flag(b)
    b.set_defaults(func=cmd_bench)


def add_shape_flag(parser: Any) -> None:
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME=DIMS",
                        help="input shape to plan for, e.g. images=1x3x320x320 (repeatable; "
                        "needed for inputs with dynamic dims unless [[models]] input_shapes "
                        "sets them)")


def input_shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]] | None:
    """``--input-shape`` flags as a dict (None when none was given)."""
    from edgepilot.dispatch.graph.signature import parse_shape_arg
    from edgepilot.errors import PlanError

    out: dict[str, tuple[int, ...]] = {}
    for text in getattr(args, "input_shape", None) or []:
        name, shape = parse_shape_arg(text)
        if name in out:
            raise PlanError(f"--input-shape names {name!r} twice", field="input_shape")
        out[name] = shape
    return out or None


def show_progress() -> bool:
    """Whether to draw the progress bar: on a terminal, unless ``EDGEPILOT_PROGRESS`` says
    otherwise (``1`` draws it into a pipe or file too, ``0`` never draws it)."""
    forced = os.environ.get("EDGEPILOT_PROGRESS", "")
    if forced in ("0", "1"):
        return forced == "1"
    return sys.stderr.isatty()


_bar_open = False  # a bar line is drawn and not yet ended with a newline


def progress_bar(done: int, total: int, label: str) -> None:
    """A one-line progress bar on stderr (only when stderr is a terminal or forced)."""
    global _bar_open
    if not show_progress():
        return
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                     f"{label[:60]:<60}")
    _bar_open = done < total
    if not _bar_open:
        sys.stderr.write("\n")
    sys.stderr.flush()


def end_progress() -> None:
    """End a bar left mid-line (a phase that stopped early) before printing results."""
    global _bar_open
    if _bar_open:
        sys.stderr.write("\n")
        sys.stderr.flush()
        _bar_open = False


def ensure_models(config: Config) -> None:
    """Like the daemon: an empty model dir gets the demo models (demo-chat, demo-mlp)."""
    if config.daemon.demo_models and not config.models:
        from edgepilot.formats.demo import ensure_demo_models

        ensure_demo_models(config.model_dir)


def make_dispatcher(config: Config) -> Any:
    from edgepilot.dispatch.dispatcher import Dispatcher

    ensure_models(config)
    board = None
    try:
        from edgepilot.board import Board

        board = Board(config.daemon.sysfs_root)
    except Exception:  # no board layer or an unreadable root: plan at clock scale 1
        board = None
    return Dispatcher(config, board=board, progress=progress_bar)


def render_gguf(plan: dict[str, Any]) -> str:
    lines = [f"model {plan['model']}  plan {plan['hash']}  (GGUF on llama.cpp)",
             f"n_threads {plan['n_threads']}  n_gpu_layers {plan['n_gpu_layers']}  "
             f"prefill {plan['prefill_tokens_per_s']} tok/s  decode "
             f"{plan['decode_tokens_per_s']} tok/s",
             f"note: {plan['note']}",
             f"{'candidate':<34} {'request ms':>10} {'decode ms/tok':>13}  verdict"]
    for c in plan["candidates"]:
        label = f"threads {c['n_threads']}, n_gpu_layers {c['n_gpu_layers']}"
        verdict = "ok" if c["eligible"] else c["reason"]
        lines.append(f"{label:<34} {_ms(c['request_ms']):>10} "
                     f"{_ms(c['decode_ms_per_token']):>13}  {verdict}")
    lines.append("blocks: " + ", ".join(
        f"{s['target']}[{s['layers'][0]}:{s['layers'][1]}]" for s in plan["segments"]))
    lines.append(f"total: predicted {_ms(plan['predicted_ms'])} ms, measured "
                 f"{_ms(plan['measured_ms'])} ms per decoded token"
                 + ("  (measurements from cache)" if plan.get("from_cache") else ""))
    return "\n".join(lines)


def render_plan(plan: dict[str, Any]) -> str:
    if plan.get("kind") == "gguf":
        return render_gguf(plan)
    used = plan.get("inputs_used") or {}
    lines = [f"model {plan['model']}  plan {plan['hash']}  tolerance {plan.get('tolerance')}",
             f"input shapes {plan.get('signature') or '-'}; calibrated on "
             f"{used.get('count', '?')} {used.get('source', '?')} input(s): "
             + "; ".join(f"{k}: {v}" for k, v in (used.get("inputs") or {}).items()),
             f"{'layer':<34} {'target':<24} {'pred ms':>8} {'meas ms':>8}  runner-up"]
    for lay in plan["layers"]:
        ru = lay.get("runner_up") or {}
        ru_txt = f"{ru.get('target')} {ru.get('predicted_ms')} ms" if ru else "-"
        lines.append(f"{lay['name'][:34]:<34} {lay['target']:<24} "
                     f"{_ms(lay.get('predicted_ms')):>8} {_ms(lay.get('measured_ms')):>8}  "
                     f"{ru_txt}")
    lines.append("segments: " + ", ".join(
        f"{s['target']}[{s['layers'][0]}:{s['layers'][1]}]" for s in plan["segments"]))
    lines.append(f"total: predicted {_ms(plan['predicted_ms'])} ms, measured "
                 f"{_ms(plan['measured_ms'])} ms, error {plan.get('error'):.4g}"
                 + ("  (profile from cache)" if plan.get("from_cache") else ""))
    busy = (plan.get("versus_single") or {}).get("contention") or 0.0
    if busy > CONTENDED:
        lines.append(f"note: other work took {busy:.0%} of the CPUs while the plan was timed "
                     "against its rival; the choice may not hold on a quiet board: plan "
                     "again (--reprofile) when it is quiet")
    sigs = plan.get("signatures")
    if sigs:
        lines.append(f"signature {sigs['served'] or '(subgraph 0, unnamed)'} planned and served; "
                     f"not served: {', '.join(sigs['others'])}")
    return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def cmd_plan(args: argparse.Namespace) -> int:
    dispatcher = make_dispatcher(config_from(args))
    md = dispatcher.get(args.model, input_shapes(args))
    md.prepare(reprofile=args.reprofile)
    plan = md.explain()
    end_progress()
    print(json.dumps(plan, indent=2) if args.json else render_plan(plan))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from edgepilot.dispatch.bench import bench
    from edgepilot.dispatch.model_dispatch import ModelDispatch
    from edgepilot.errors import ConfigError, ModelError

    if not 1 <= args.runs <= 10_000:
        raise ConfigError(f"--runs {args.runs}: allowed 1..10000", field="runs")
    if not 0 <= args.budget_s <= 60:
        raise ConfigError(f"--budget-s {args.budget_s}: allowed 0..60", field="budget_s")
    if args.compiles is not None and not 1 <= args.compiles <= 8:
        raise ConfigError(f"--compiles {args.compiles}: allowed 1..8", field="compiles")
    dispatcher = make_dispatcher(config_from(args))
    md = dispatcher.get(args.model, input_shapes(args))
    if not isinstance(md, ModelDispatch):
        raise ModelError(f"bench compares per-layer plans of ONNX/TFLite models; for the GGUF "
                         f"model {args.model!r} run `edgepilot plan {args.model}`, which times "
                         "every llama.cpp candidate", field="model")
    result = bench(md, runs=args.runs, budget_s=args.budget_s, compiles=args.compiles)
    end_progress()
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"model {result['model']}  plan {result['hash']}  tolerance {result['tolerance']}")
    p = result["plan"]
    print(f"{'plan':<28} {p['median_ms']:>9.3f} ms  err {p['error']:.4f}  "
          f"predicted {p['predicted_ms']:.3f} ms  ({' -> '.join(p['targets'])})")
    for name, s in result["single"].items():
        ok = "ok" if s["within_tolerance"] else "over tolerance"
        print(f"{name:<28} {s['median_ms']:>9.3f} ms  err {s['error']:.4f}  {ok}")
    if result["raw"]:
        print(f"{'raw runtime':<28} {result['raw']['median_ms']:>9.3f} ms")
    print(f"plan vs best single within tolerance: x{result['speedup_vs_best_single']}; "
          f"predicted/measured: {result['predicted_vs_measured']}")
    busy = result["contention"]["bench"]
    if busy > CONTENDED:
        print(f"note: other work took {busy:.0%} of the CPUs during the rounds: these ratios "
              "are suspect; bench again when the board is quiet")
    return 0
