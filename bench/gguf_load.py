"""Part 1 of ``bench/gguf_bench.py``: a GGUF's load, raw ``llama_cpp.Llama(path)`` against the
daemon's load path (the model registry, with its spare worker ready), and where each went."""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import llama_cpp

from edgepilot.config import parse_config
from edgepilot.formats import files, gguf_info
from edgepilot.lifecycle import Daemon

N_CTX = 2048


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "n": len(values)}


SPLIT = ("worker_start_ms", "model_ms", "context_ms")


def raw_load(path: Path, splits: list[dict[str, float]] | None = None) -> float:
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, verbose=False)
    dt = time.perf_counter() - t0
    if splits is not None:
        model_ms = float(llama_cpp.llama_perf_context(llm.ctx).t_load_ms)
        splits.append({"model_ms": model_ms, "context_ms": dt * 1e3 - model_ms})
    llm.close()
    return dt


def registry_daemon(state: Path, models: Path) -> Daemon:
    cfg = parse_config({"daemon": {"state_dir": str(state), "model_dir": str(models),
                                   "demo_models": False},
                        "mqtt": {"enabled": False}, "backends": {"llamacpp": {"n_ctx": N_CTX}},
                        "dispatch": {"gguf_prompt_tokens": 8, "gguf_decode_tokens": 4}})
    d = Daemon(cfg)
    d.attach_capabilities({"serving", "dispatch"})
    return d


def daemon_load(state: Path, models: Path, name: str,
                splits: list[dict[str, float]] | None = None) -> float:
    """One load through the registry, as a freshly started daemon does it once ready: its spare
    worker started (``[backends.llamacpp] spare_worker``) and done with its imports, the GGUF
    headers of its models read."""
    gguf_info._cache.clear()
    files._digests.clear()
    d = registry_daemon(state, models)
    assert d.backends is not None and d.models is not None
    d.models.prepare_loads()  # as the daemon does once ready: a spare worker, headers read
    spares = d.backends.get("llamacpp").spares  # type: ignore[attr-defined]
    if not spares.wait_ready(60):
        raise SystemExit("the spare llama.cpp worker did not start in 60 s")

    async def load() -> float:
        t0 = time.perf_counter()
        lm = await d.models.load(name)
        dt = time.perf_counter() - t0
        if splits is not None:
            split = dict(lm.executable.load_split or {})
            split["rest_ms"] = dt * 1e3 - sum(float(split.get(k, 0)) for k in SPLIT)
            splits.append(split)
        await d.models.close()
        d.backends.close_spares()  # type: ignore[union-attr]
        return dt

    try:
        return asyncio.run(load())
    finally:
        d.executor.shutdown(wait=True)


def bench_load(path: Path, work: Path, rounds: int) -> dict[str, Any]:
    models = work / "load-models"
    models.mkdir()
    if path.stat().st_dev == models.stat().st_dev:
        os.link(path, models / "m.gguf")  # no 100 MB copy
    else:
        shutil.copy(path, models / "m.gguf")
    cold, warm = work / "state-noplan", work / "state-plan"
    # a cached plan for the second variant (measured once, before timing anything)
    registry_daemon(warm, models).dispatcher.plan_for("m")
    raw_load(path)  # page cache warm for everyone
    times: dict[str, list[float]] = {"raw": [], "daemon": [], "daemon_planned": []}
    splits: dict[str, list[dict[str, float]]] = {k: [] for k in times}
    for r in range(rounds):
        order = ["raw", "daemon", "daemon_planned"]
        order = order if r % 2 == 0 else order[::-1]
        for variant in order:
            if variant == "raw":
                times["raw"].append(raw_load(path, splits["raw"]))
            else:
                times[variant].append(daemon_load(cold if variant == "daemon" else warm,
                                                  models, "m", splits[variant]))
    out: dict[str, Any] = {k: summary(v) for k, v in times.items()}
    out["split_ms"] = {k: {f: round(statistics.median(float(s.get(f, 0)) for s in v), 1)
                           for f in (*SPLIT, "rest_ms") if any(f in s for s in v)}
                       for k, v in splits.items()}
    out["spare_used"] = sum(bool(s.get("spare")) for s in splits["daemon"])
    for k in ("daemon", "daemon_planned"):
        out[f"{k}_over_raw"] = round(statistics.median(
            d / r for d, r in zip(times[k], times["raw"], strict=True)), 3)
    return out


