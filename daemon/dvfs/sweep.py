"""A model measured under DVFS profiles: latency (p50, p95), board power, energy per inference.

For each profile: apply it (transactionally), plan the model for those clocks (plans are cached
per DVFS profile), time the plan as ``bench`` does while sampling the board's power, put the
board back. Used by ``edgepilot sweep`` (:mod:`edgepilot.cli.sweep`) and by the daemon's SLO
picker (:mod:`edgepilot.dvfs.slo`); :func:`summarize` adds the decisions (fastest, most
efficient, Pareto front, SLO pick).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from edgepilot.dvfs.pareto import pareto_front, slo_pick
from edgepilot.errors import EdgepilotError, ModelError
from edgepilot.formats.catalog import ModelCatalog
from edgepilot.telemetry.power_window import PowerSampler

Progress = Callable[[int, int, str], None]


def sweep_one(config: Any, board: Any, manager: Any, model: str, profile: str, runs: int,
              budget_s: float, shapes: dict[str, tuple[int, ...]] | None = None, *,
              backends: dict[str, Any] | None = None, progress: Progress | None = None,
              reason: str = "sweep",
              hold: Callable[[], AbstractContextManager[Any]] | None = None,
              catalog: ModelCatalog | None = None) -> dict[str, Any]:
    """Apply ``profile``, plan and time ``model`` under it; the caller restores the board.

    ``backends``: loaded backends to reuse (the daemon's); ``hold``: a context manager factory
    held while the plan is timed (the daemon's device queues, so its requests wait);
    ``catalog``: where the model's name is looked up (the daemon's; else the config's).
    """
    from edgepilot.dispatch.bench import bench
    from edgepilot.dispatch.dispatcher import Dispatcher
    from edgepilot.dispatch.model_dispatch import ModelDispatch

    manager.apply(profile, reason=reason)
    # a fresh dispatcher: plans and profiles are keyed by the DVFS profile now active
    dispatcher = Dispatcher(config, board=board, profiles=manager, progress=progress,
                            backends=backends, catalog=catalog)
    md = dispatcher.get(model, shapes)
    if not isinstance(md, ModelDispatch):
        raise ModelError(f"sweep times per-layer plans of ONNX/TFLite models; for the GGUF model "
                         f"{model!r} run `edgepilot plan {model}` under each profile",
                         field="model")
    md.prepare()
    with (hold() if hold is not None else contextlib.nullcontext()), PowerSampler(board) as power:
        result = bench(md, runs=runs, budget_s=budget_s)
    ms = result["plan"]["median_ms"]
    watts = power.mean_w
    sample = board.sample()
    clocks = {name: {k: c.get(k) for k in ("governor", "min_khz", "max_khz")}
              for name, c in sample.cpu.items()}
    devfreq = {name: {k: d.get(k) for k in ("governor", "min_hz", "max_hz")}
               for name, d in sample.devfreq.items()}
    return {"profile": profile, "ok": True, "plan": result["hash"],
            "targets": result["plan"]["targets"], "median_ms": ms, "p50_ms": ms,
            "p95_ms": result["plan"].get("p95_ms"),
            "error": result["plan"]["error"],
            "power_w": round(watts, 6) if watts is not None else None,
            # board energy while one inference runs (the whole board's draw, as telemetry)
            "energy_mj_per_inference": round(watts * ms, 6) if watts is not None else None,
            "cpu": clocks, "devfreq": devfreq}


def measure_profiles(config: Any, board: Any, manager: Any, model: str, names: list[str],
                     runs: int, budget_s: float, shapes: dict[str, tuple[int, ...]] | None = None,
                     *, each: Callable[[], AbstractContextManager[Any]] | None = None,
                     **kw: Any) -> list[dict[str, Any]]:
    """Every profile in ``names`` in turn (keywords as :func:`sweep_one`), the board restored
    after each (each profile starts from the board as found) and at the end, whatever happens.
    A profile that fails is a row with ``ok`` false and its ``reason``. ``each``: a context
    held around one profile's apply, measurement and restore (the daemon's DVFS lock)."""
    rows: list[dict[str, Any]] = []
    reason = kw.get("reason", "sweep")
    try:
        for name in names:
            with each() if each is not None else contextlib.nullcontext():
                try:
                    rows.append(sweep_one(config, board, manager, model, name, runs, budget_s,
                                          shapes, **kw))
                except ModelError:
                    raise
                except EdgepilotError as exc:  # one profile failing does not end the sweep
                    rows.append({"profile": name, "ok": False, "reason": exc.message})
                finally:
                    manager.restore(reason=reason)
    finally:
        manager.restore(reason=reason)
    return rows


def summarize(model: str, rows: list[dict[str, Any]], slo_ms: float | None = None
              ) -> dict[str, Any]:
    """The sweep JSON: rows, the fastest and the most efficient profile, the Pareto front of
    energy per inference against p95 latency (``pareto``, and ``pareto`` per row), and with
    ``slo_ms`` the SLO pick (``slo_pick``, or null with ``slo_reason``)."""
    done = [r for r in rows if r["ok"]]
    with_energy = [r for r in done if r["energy_mj_per_inference"] is not None]
    front = pareto_front(rows)
    for r in rows:
        if r["ok"]:
            r["pareto"] = r["profile"] in front
    result: dict[str, Any] = {
        "model": model, "profiles": rows,
        "fastest": min(done, key=lambda r: r["median_ms"])["profile"] if done else None,
        "most_efficient": min(with_energy, key=lambda r: r["energy_mj_per_inference"])["profile"]
        if with_energy else None,
        "pareto": front,
    }
    if slo_ms is not None:
        result["slo_ms"] = slo_ms
        result.update(slo_pick(rows, slo_ms).as_dict())
    return result
