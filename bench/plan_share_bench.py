"""The first plan on the second board of a kind: measured, against the first board's.

    .venv/bin/python bench/plan_share_bench.py [--models minilm,opennsfw,efficientnet-lite0]
        [--tolerance 0.10] [--json FILE]

Per real model (tests/real_models.py: exported files shipped in registry packages), in one run
on this machine: board 1 (a dispatcher with its own state dir) plans the model, measuring every
(layer, target) cell, and publishes the plan into a PlanExchange; board 2 (another state dir,
the same fingerprint) plans the same model through that exchange: it adopts the published plan
after its verification at the default tolerance (±10% end to end and per segment), or, when
the verification fails on this loaded machine, measures it itself. Each board is a process of
its own, timed from its plan request (edgepilot imported; what planning imports lazily is
inside the span) to its plan. Printed: each board's time, the ratio (board 2 / board 1), the
plan's targets, whether board 2 adopted, and why not. The kernel corpus is off for both (it is
per board and measured once; with it on, board 2 would measure its own corpus).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from real_models import by_name  # noqa: E402

from edgepilot.config import parse_config  # noqa: E402
from edgepilot.dispatch.dispatcher import Dispatcher  # noqa: E402
from edgepilot.dispatch.planning.cache import PlanCache  # noqa: E402
from edgepilot.dispatch.planning.shared import PlanExchange, signature_segment  # noqa: E402


class Events:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def __call__(self, kind: str, **fields: Any) -> None:
        self.seen.append({"type": kind, **fields})


def board(tmp: Path, n: int, model: Any, exchange: PlanExchange) -> Dispatcher:
    state = tmp / f"board{n}"
    cfg = parse_config({"daemon": {"state_dir": str(state), "demo_models": False,
                                   "model_dir": str(model.path.parent)},
                        "dispatch": {"kernel_corpus": False},
                        "models": [{"name": model.name, "file": model.path.name,
                                    "input_shapes": model.input_shapes}]})
    return Dispatcher(cfg, emit=exchange.emit,
                      plan_cache=PlanCache(state / "plans", shared=exchange))


def board_run(n: int, model_name: str, tmp: Path, tolerance: float) -> dict[str, Any]:
    """One board's first plan of the model, in this (fresh) process: board 1 publishes into
    ``tmp/published.json``, board 2 is offered what is there (the broker's retained plans)."""
    model = by_name(model_name)
    events = Events()
    published: list[tuple[str, str]] = []
    # one fingerprint for both: the same machine stands for two boards of one kind
    exchange = PlanExchange(lambda parts: "b" * 16, emit=events, wait_s=0, tolerance=tolerance)
    exchange.connect(lambda suffix, payload: published.append((suffix, payload.decode())))
    store = tmp / "published.json"
    if n > 1:
        for suffix, payload in json.loads(store.read_text()):
            fp, sha, sig = suffix.split("/", 2)
            exchange.offer(f"edgepilot/fleet/plans/{suffix}", fp, sha, sig, payload.encode())
    t = time.monotonic()
    plan = board(tmp, n, model, exchange).plan_for(model.name)
    spent = time.monotonic() - t
    if n == 1:
        store.write_text(json.dumps(published))
    return {"s": spent, "plan": plan, "events": events.seen}


def one(model_name: str, tmp: Path, tolerance: float) -> dict[str, Any]:
    """Board 1 then board 2, each in a process of its own (nothing cached in memory between
    them, as between two boards); each is timed from its plan request to its plan."""
    runs = []
    for n in (1, 2):
        out = subprocess.run([sys.executable, __file__, "--board", str(n), "--models",
                              model_name, "--tmp", str(tmp), "--tolerance", str(tolerance)],
                             check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    (first, second), planned_s, second_s = runs, runs[0]["s"], runs[1]["s"]
    plan1, plan2 = first["plan"], second["plan"]
    adopted = [e for e in second["events"] if e["type"] == "plan.adopted"]
    rejected = [e["reason"] for e in second["events"] if e["type"] == "plan.rejected"]
    return {"model": model_name, "layers": len(plan1["layers"]) if "layers" in plan1 else None,
            "signature": signature_segment(plan1.get("signature") or ""),
            "board1_plan_s": round(planned_s, 2), "board2_s": round(second_s, 2),
            "ratio": round(second_s / planned_s, 3), "adopted": bool(adopted),
            "segments": len(plan1["segments"]),
            "targets": sorted({seg["target"] for seg in plan1["segments"]}),
            "same_plan": plan1["segments"] == plan2["segments"], "rejected": rejected,
            "load_avg": round(os.getloadavg()[0], 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="minilm,opennsfw,efficientnet-lite0")
    ap.add_argument("--tolerance", type=float, default=0.10,
                    help="board 2's verification tolerance (the daemon's default: 0.10)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--board", type=int, default=0, help=argparse.SUPPRESS)  # one board's run
    ap.add_argument("--tmp", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.board:
        print(json.dumps(board_run(args.board, args.models, args.tmp, args.tolerance),
                         default=str))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="plan-share-") as tmp:
        for name in args.models.split(","):
            (Path(tmp) / name).mkdir()
            row = one(name, Path(tmp) / name, args.tolerance)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
