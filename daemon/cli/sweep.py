"""``edgepilot sweep MODEL``: the model's plan under every DVFS profile, latency and energy.

For each profile that validates on this board: apply it (transactionally), plan the model for
those clocks (profiles are cached per DVFS profile), time the plan side by side as ``bench`` does
while sampling the board's power, then move on; the board is restored at the end, also on error
or Ctrl-C. Answers the operator's question "which profile for this model: fastest, or fewest
joules per inference?". Run it with the daemon stopped: both would own the clocks.

The measuring itself is :mod:`edgepilot.dvfs.sweep`. ``--slo-ms P`` names the lowest-energy profile
whose p95 meets P (``slo_pick``, or null with ``slo_reason``); ``--csv`` and ``--plot`` write
the rows and the latency/energy picture with its Pareto front (:mod:`edgepilot.cli.sweep_report`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from edgepilot.cli.common import config_from
from edgepilot.cli.plan import (
    add_shape_flag,
    end_progress,
    ensure_models,
    input_shapes,
    progress_bar,
)
from edgepilot.cli.sweep_report import write_csv, write_plot
from edgepilot.dvfs.sweep import measure_profiles, summarize
from edgepilot.errors import ConfigError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sweep", help="plan and time a model under every DVFS profile "
                                     "(latency, power, energy per inference)")
    p.add_argument("model", help="model name, file stem in --model-dir, or path")
    p.add_argument("--profiles", default=None,
                   help="comma-separated profile names (default: every one valid here)")
    p.add_argument("--runs", type=int, default=30, help="fewest timed rounds (default 30)")
    p.add_argument("--budget-s", type=float, default=0.3,
                   help="timed seconds the plan gets at least per profile (default 0.3, 0..60)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--csv", type=Path, default=None, metavar="FILE",
                   help="also write one row per profile (p50, p95, power, energy, Pareto, SLO)")
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                   help="also draw latency (p50, p95) against energy per inference, the Pareto "
                   "front marked (needs matplotlib: the 'plot' extra)")
    p.add_argument("--slo-ms", type=float, default=None, metavar="P",
                   help="name the lowest-energy profile whose p95 latency is at most P ms")
    add_shape_flag(p)
    p.set_defaults(func=cmd_sweep)


def run_sweep(config: Any, model: str, profiles: list[str] | None, runs: int,
              budget_s: float, shapes: dict[str, tuple[int, ...]] | None = None,
              slo_ms: float | None = None) -> dict[str, Any]:
    """Every profile in turn, the board restored at the end whatever happens."""
    from edgepilot.dvfs.service import make_manager

    ensure_models(config)
    manager = make_manager(config)
    board = manager.board
    names = profiles or [p["name"] for p in manager.list() if p.get("valid")]
    if not names:
        raise ConfigError("no DVFS profile is valid on this board (see `edgepilot profile "
                          "list`); nothing to sweep", field="profiles")
    rows = measure_profiles(config, board, manager, model, names, runs, budget_s, shapes,
                            progress=progress_bar)
    return summarize(model, rows, slo_ms)


def cmd_sweep(args: argparse.Namespace) -> int:
    if not 1 <= args.runs <= 10_000:
        raise ConfigError(f"--runs {args.runs}: allowed 1..10000", field="runs")
    if not 0 <= args.budget_s <= 60:
        raise ConfigError(f"--budget-s {args.budget_s}: allowed 0..60", field="budget_s")
    if args.slo_ms is not None and not 0 < args.slo_ms <= 3_600_000:
        raise ConfigError(f"--slo-ms {args.slo_ms:g}: allowed a latency above 0 and at most "
                          "3600000 ms", field="slo_ms")
    for flag, path in (("--csv", args.csv), ("--plot", args.plot)):
        if path is not None and not path.parent.is_dir():
            raise ConfigError(f"{flag} {path}: the directory {path.parent} does not exist",
                              field=flag.lstrip("-"))
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401 - checked before minutes of measuring, not after
        except ImportError:
            raise ConfigError("--plot needs matplotlib; install it with "
                              "`.venv/bin/pip install 'edgepilot[plot]'`", field="plot") from None
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()] \
        if args.profiles else None
    result = run_sweep(config_from(args), args.model, profiles, args.runs, args.budget_s,
                       input_shapes(args), args.slo_ms)
    end_progress()
    if args.csv is not None:
        write_csv(result, args.csv)
    if args.plot is not None:
        write_plot(result, args.plot)
    code = 0 if any(r["ok"] for r in result["profiles"]) else 1
    if args.json:
        print(json.dumps(result, indent=2))
        return code
    print(f"model {result['model']}")
    print(f"{'profile':<14} {'plan':<11} {'median ms':>10} {'p95 ms':>9} {'power W':>8} "
          f"{'mJ/inf':>9}  targets")
    for r in result["profiles"]:
        if not r["ok"]:
            print(f"{r['profile']:<14} failed: {r['reason']}")
            continue
        watts = f"{r['power_w']:.3f}" if r["power_w"] is not None else "-"
        mj = f"{r['energy_mj_per_inference']:.4f}" \
            if r["energy_mj_per_inference"] is not None else "-"
        mark = "*" if r.get("pareto") else " "
        print(f"{r['profile']:<13}{mark} {r['plan']:<11} {r['median_ms']:>10.4f} "
              f"{r['p95_ms']:>9.4f} {watts:>8} {mj:>9}  {' -> '.join(r['targets'])}")
    print(f"fastest: {result['fastest']}; fewest joules per inference: "
          f"{result['most_efficient'] or 'unknown (no power sensor)'}")
    if result["pareto"]:
        print(f"Pareto front (energy vs p95, marked *): {', '.join(result['pareto'])}")
    if args.slo_ms is not None:
        if result["slo_pick"] is not None:
            print(f"SLO p95 <= {args.slo_ms:g} ms: {result['slo_pick']} (the fewest joules per "
                  "inference among the profiles that meet it)")
        else:
            print(f"SLO p95 <= {args.slo_ms:g} ms: no pick: {result['slo_reason']}")
    for flag, path in (("csv", args.csv), ("plot", args.plot)):
        if path is not None:
            print(f"{flag}: {path}")
    print("the board was restored to its clocks before the sweep")
    return code
