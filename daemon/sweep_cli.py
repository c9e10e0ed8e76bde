"""``edgepilot sweep MODEL``: the model's plan under every DVFS profile, latency and energy.

For each profile that validates on this board: apply it (transactionally), plan the model for
those clocks (profiles are cached per DVFS profile), time the plan side by side as ``bench`` does
while sampling the board's power, then move on; the board is restored at the end, also on error
or Ctrl-C. Answers the operator's question "which profile for this model: fastest, or fewest
joules per inference?". Run it with the daemon stopped: both would own the clocks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
from typing import Any

from edgepilot.errors import ConfigError, EdgepilotError, ModelError

SAMPLE_PERIOD_S = 0.1


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
    from edgepilot.plan_cli import add_shape_flag

    add_shape_flag(p)
    p.set_defaults(func=cmd_sweep)


class PowerSampler:
    """Board power sampled on a thread while a measurement runs (mean of readable samples)."""

    def __init__(self, board: Any) -> None:
        self.board = board
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweep-power", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            watts = self.board.sample().power_w
            if watts is not None:
                self.samples.append(float(watts))
            self._stop.wait(SAMPLE_PERIOD_S)

    def __enter__(self) -> PowerSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def mean_w(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


def sweep_one(config: Any, board: Any, manager: Any, model: str, profile: str, runs: int,
              budget_s: float, shapes: dict[str, tuple[int, ...]] | None = None
              ) -> dict[str, Any]:
    """Apply ``profile``, plan and time ``model`` under it; the caller restores the board."""
    from edgepilot.dispatch.bench import bench
    from edgepilot.dispatch.dispatcher import Dispatcher
    from edgepilot.dispatch.model_dispatch import ModelDispatch
    from edgepilot.plan_cli import progress_bar

    manager.apply(profile, reason="sweep")
    # a fresh dispatcher: plans and profiles are keyed by the DVFS profile now active
    dispatcher = Dispatcher(config, board=board, profiles=manager, progress=progress_bar)
    md = dispatcher.get(model, shapes)
    if not isinstance(md, ModelDispatch):
        raise ModelError(f"sweep times per-layer plans of ONNX/TFLite models; for the GGUF model "
                         f"{model!r} run `edgepilot plan {model}` under each profile",
                         field="model")
    md.prepare()
    with PowerSampler(board) as power:
        result = bench(md, runs=runs, budget_s=budget_s)
    ms = result["plan"]["median_ms"]
    watts = power.mean_w
    clocks = {name: {k: c.get(k) for k in ("governor", "min_khz", "max_khz")}
              for name, c in board.sample().cpu.items()}
    return {"profile": profile, "ok": True, "plan": result["hash"],
            "targets": result["plan"]["targets"], "median_ms": ms,
            "error": result["plan"]["error"],
            "power_w": round(watts, 6) if watts is not None else None,
            # board energy while one inference runs (the whole board's draw, as telemetry)
            "energy_mj_per_inference": round(watts * ms, 6) if watts is not None else None,
            "cpu": clocks}


def run_sweep(config: Any, model: str, profiles: list[str] | None, runs: int,
              budget_s: float, shapes: dict[str, tuple[int, ...]] | None = None
              ) -> dict[str, Any]:
    """Every profile in turn, the board restored at the end whatever happens."""
    from edgepilot.dvfs.service import make_manager
    from edgepilot.plan_cli import ensure_models

    ensure_models(config)
    manager = make_manager(config)
    board = manager.board
    names = profiles or [p["name"] for p in manager.list() if p.get("valid")]
    if not names:
        raise ConfigError("no DVFS profile is valid on this board (see `edgepilot profile "
                          "list`); nothing to sweep", field="profiles")
    rows: list[dict[str, Any]] = []
    try:
        for name in names:
            try:
                rows.append(sweep_one(config, board, manager, model, name, runs, budget_s,
                                      shapes))
            except ModelError:
                raise
            except EdgepilotError as exc:  # one profile failing does not end the sweep
                rows.append({"profile": name, "ok": False, "reason": exc.message})
            finally:
                # each profile starts from the board as it was found, as it would at boot
                manager.restore(reason="sweep")
    finally:
        manager.restore(reason="sweep")
    done = [r for r in rows if r["ok"]]
    with_energy = [r for r in done if r["energy_mj_per_inference"] is not None]
    return {
        "model": model, "profiles": rows,
        "fastest": min(done, key=lambda r: r["median_ms"])["profile"] if done else None,
        "most_efficient": min(with_energy, key=lambda r: r["energy_mj_per_inference"])["profile"]
        if with_energy else None,
    }


def cmd_sweep(args: argparse.Namespace) -> int:
    from edgepilot.cli import config_from

    if not 1 <= args.runs <= 10_000:
        raise ConfigError(f"--runs {args.runs}: allowed 1..10000", field="runs")
    if not 0 <= args.budget_s <= 60:
        raise ConfigError(f"--budget-s {args.budget_s}: allowed 0..60", field="budget_s")
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()] \
        if args.profiles else None
    from edgepilot.plan_cli import input_shapes

    result = run_sweep(config_from(args), args.model, profiles, args.runs, args.budget_s,
                       input_shapes(args))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0 if any(r["ok"] for r in result["profiles"]) else 1
    print(f"model {result['model']}")
    print(f"{'profile':<14} {'plan':<11} {'median ms':>10} {'power W':>8} {'mJ/inf':>9}  targets")
    for r in result["profiles"]:
        if not r["ok"]:
            print(f"{r['profile']:<14} failed: {r['reason']}")
            continue
        watts = f"{r['power_w']:.3f}" if r["power_w"] is not None else "-"
        mj = f"{r['energy_mj_per_inference']:.4f}" \
            if r["energy_mj_per_inference"] is not None else "-"
        print(f"{r['profile']:<14} {r['plan']:<11} {r['median_ms']:>10.4f} {watts:>8} {mj:>9}  "
              f"{' -> '.join(r['targets'])}")
    print(f"fastest: {result['fastest']}; fewest joules per inference: "
          f"{result['most_efficient'] or 'unknown (no power sensor)'}")
    print("the board was restored to its clocks before the sweep")
    return 0 if any(r["ok"] for r in result["profiles"]) else 1
