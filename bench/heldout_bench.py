"""Benchmark the dispatcher on files outside the corpus, listed in a manifest, as real_bench does.

Usage: .venv/bin/python bench/heldout_bench.py MANIFEST.json --root DIR [--out FILE]
       [--state-dir DIR] [--runs 30] [--budget-s 0.3] [--only NAME[,NAME]]

The manifest is a JSON list of ``{"name", "path", "what", "input_shapes"}``, ``path`` relative
to ``--root`` (where the packages were unpacked: see bench/README.md for the commands). Each
file is planned fresh in the state dir and timed by ``real_bench.run_one``: the plan, every
single target and the raw runtime, side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_bench

from edgepilot.config import Config
from edgepilot.errors import EdgepilotError


@dataclass(frozen=True)
class HeldOut:
    """One manifest entry, with the fields ``real_bench.run_one`` reads."""

    name: str
    path: Path
    what: str
    input_shapes: dict[str, list[int]] = field(default_factory=dict)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifest")
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", default="heldout_results.json")
    ap.add_argument("--state-dir", default=str(Path.home() / ".cache" / "edgepilot-heldout"))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=0.3)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = {n for n in args.only.split(",") if n}
    entries = [HeldOut(e["name"], Path(args.root) / e["path"], e.get("what", ""),
                       e.get("input_shapes", {}))
               for e in json.loads(Path(args.manifest).read_text())]
    config = Config.model_validate({"daemon": {"state_dir": args.state_dir,
                                               "demo_models": False}})
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    for entry in entries:
        if only and entry.name not in only:
            continue
        print(f"== {entry.name}: {entry.what}", file=sys.stderr, flush=True)
        try:
            results.append(real_bench.run_one(config, entry, args.runs,  # type: ignore[arg-type]
                                              args.budget_s, False))
        except EdgepilotError as exc:
            results.append({"model": entry.name, "error": exc.message})
        except Exception as exc:  # report every file, met or not
            results.append({"model": entry.name, "error": f"{type(exc).__name__}: {exc}"})
        print(real_bench.table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    out = {"seconds": round(time.perf_counter() - started, 1), "results": results}
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(real_bench.table(results))
    print(f"\n{len(results)} files in {out['seconds']} s; full results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
