"""Predicted vs measured, two whole-model estimators side by side in one process.

Usage: .venv/bin/python bench/prediction_ab.py --state-dir DIR [--only NAME[,NAME]]
       [--out bench/prediction_ab_results.json]

A single-target plan is predicted by the profile's timing of that target's whole model. For
each model (a fresh plan, then ``bench`` as ``real_bench.py`` runs it), the profile takes that
timing as ``dispatch/measuring/timing.py`` does now (the plan's executor, one median over
>= 300 ms) and, right after it on fresh compiles, as it did before (the lower of ``passes``
7-run medians of the bare executable on the reference env); both are divided by the bench's
median of the plan. The old estimator is reproduced here, by wrapping ``Measurer.measure``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_bench
from real_models import CORPUS

import edgepilot.dispatch.measuring.measure as measure_mod
from edgepilot.backends.base import Target
from edgepilot.config import Config
from edgepilot.dispatch.measuring.cells import Cell
from edgepilot.dispatch.measuring.measure import Measurer
from edgepilot.dispatch.measuring.timing import MIN_TIMED_MS, median_ms

OLD: dict[str, float] = {}
_measure = Measurer.measure


def _both(self: Measurer, start: int, end: int, target: Target, bound_ms: float | None = None,
          as_plan: bool = False) -> Cell:
    """The profile's cell as it is taken now, and for a whole model the old figure too."""
    cell = _measure(self, start, end, target, bound_ms, as_plan)
    if as_plan and cell.ms is not None and (bound_ms is None or cell.ms <= 3 * bound_ms):
        envs = self.reference_envs()
        best = float("inf")
        for _ in range(self.passes):
            exe = self.compile(start, end, target)
            for env in envs:
                exe.run(env)
            best = min(best, median_ms(lambda exe=exe: exe.run(envs[0]), self.runs,
                                       self.warmup, MIN_TIMED_MS))
            exe.close()
        OLD[str(target)] = best
    return cell


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-dir", required=True, help="a fresh one: every model is planned")
    ap.add_argument("--only", default="", help="comma-separated corpus names")
    ap.add_argument("--out", default=str(Path(__file__).parent / "prediction_ab_results.json"))
    args = ap.parse_args()
    measure_mod.Measurer.measure = _both  # type: ignore[method-assign]
    only = {n for n in args.only.split(",") if n}
    config = Config.model_validate({"daemon": {"state_dir": args.state_dir,
                                               "demo_models": False}})
    rows: list[dict[str, Any]] = []
    for model in CORPUS:
        if only and model.name not in only:
            continue
        OLD.clear()
        before = os.getloadavg()[0]
        r = real_bench.run_one(config, model, 10, 0.1, False, 2)
        targets, measured = r["plan"]["targets"], r["plan"]["median_ms"]
        old = OLD.get(targets[0]) if len(targets) == 1 else None
        rows.append({"model": model.name, "targets": targets, "measured_ms": measured,
                     "new_pred_ms": r["plan"]["predicted_ms"],
                     "new_ratio": r["predicted_vs_measured"],
                     "old_pred_ms": old and round(old, 4),
                     "old_ratio": old and round(old / measured, 3),
                     "check_ms": r["plan_time"]["measured_ms"],
                     "plan_time_ratio": r["plan_time"]["predicted_vs_measured"],
                     "load": [round(before, 2), round(os.getloadavg()[0], 2)]})
        print(json.dumps(rows[-1]), flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
