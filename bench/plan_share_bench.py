"""The first plan on the second board of a kind: measured, against the first board's.

    .venv/bin/python bench/plan_share_bench.py [--models minilm,opennsfw] [--json FILE]

Per real model (tests/real_models.py: exported files shipped in registry packages), in one run
on this machine: board 1 (a dispatcher with its own state dir) plans the model, measuring every
(layer, target) cell, and publishes the plan into a PlanExchange; board 2 (another state dir,
the same fingerprint) plans the same model through that exchange: it adopts the published plan
after its verification at the default tolerance (±10% end to end and per segment), or, when
the verification fails on this loaded machine, measures it itself. Printed: each board's time,
the ratio (board 2 / board 1), whether board 2 adopted, and why not. The kernel corpus is off
for both (it is per board and measured once; with it on, board 2 would measure its own corpus).
"""

from __future__ import annotations

import argparse
import json
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


def one(model_name: str, tmp: Path) -> dict[str, Any]:
    model = by_name(model_name)
    events = Events()
    published: list[tuple[str, bytes]] = []
    # one fingerprint for both: the same machine stands for two boards of one kind
    first = PlanExchange(lambda parts: "b" * 16, emit=events, wait_s=0)
    first.connect(lambda suffix, payload: published.append((suffix, payload)))
    t = time.monotonic()
    plan1 = board(tmp, 1, model, first).plan_for(model.name)
    planned_s = time.monotonic() - t
    second = PlanExchange(lambda parts: "b" * 16, emit=events, wait_s=0)
    for suffix, payload in published:  # what the broker would hand board 2 (retained)
        fp, sha, sig = suffix.split("/", 2)
        second.offer(f"edgepilot/fleet/plans/{suffix}", fp, sha, sig, payload)
    t = time.monotonic()
    plan2 = board(tmp, 2, model, second).plan_for(model.name)
    second_s = time.monotonic() - t
    adopted = [e for e in events.seen if e["type"] == "plan.adopted"]
    rejected = [e["reason"] for e in events.seen if e["type"] == "plan.rejected"]
    return {"model": model.name, "layers": len(plan1["layers"]) if "layers" in plan1 else None,
            "signature": signature_segment(plan1.get("signature") or ""),
            "board1_plan_s": round(planned_s, 2), "board2_s": round(second_s, 2),
            "ratio": round(second_s / planned_s, 3), "adopted": bool(adopted),
            "same_plan": plan1["segments"] == plan2["segments"], "rejected": rejected}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="minilm,opennsfw")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="plan-share-") as tmp:
        for name in args.models.split(","):
            row = one(name, Path(tmp))
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
