"""The plan JSON of a GGUF model: its blocks, where each runs, the runner-up, live checks.

Kept apart from :mod:`.plans`, which measures and chooses; this only reads the choice.
"""

from __future__ import annotations

from typing import Any, Protocol

from edgepilot.dispatch.gguf.select import Candidate, Choice, GgufPlan, Measurement
from edgepilot.dispatch.planning.plan import segments_of
from edgepilot.formats.gguf_info import GgufInfo


class GgufDispatch(Protocol):
    """What the plan JSON is read from (:class:`.plans.GgufDispatch`)."""

    name: str
    info: GgufInfo
    gpu: bool
    plan: GgufPlan | None
    choice: Choice | None
    measured: list[Measurement]
    from_cache: bool
    live_choice: int | None

    def live_report(self) -> dict[str, Any]: ...


def note(d: GgufDispatch) -> str:
    """Where the blocks run and how the thread count was chosen, in one sentence."""
    assert d.plan is not None
    n, ngl = d.info.n_layers, d.plan.n_gpu_layers
    threads = sorted({m.n_threads for m in d.measured})
    how = ("decode speed on live traffic (the runner-up was tried on real requests)"
           if d.live_choice is not None else "measured prefill/decode speed")
    chosen = f"n_threads {d.plan.n_threads} chosen from {threads} by {how}"
    if not d.gpu:
        return f"this llama.cpp build has no GPU backend: all {n} blocks on cpu; {chosen}"
    return (f"{ngl} of {n} blocks on gpu (llama.cpp offloads the last blocks), "
            f"{n - ngl} on cpu; {chosen} under the memory budget")


def explain(d: GgufDispatch) -> dict[str, Any]:
    """Plan JSON for a GGUF model, one layer entry per block (the caller holds its lock)."""
    assert d.plan is not None and d.choice is not None
    plan, n = d.plan, d.info.n_layers
    share = plan.predicted_ms / n
    layers = []
    for i, target in enumerate(plan.targets):
        layers.append({"name": f"blk.{i}", "target": target,
                       "predicted_ms": round(share, 4), "measured_ms": None,
                       "runner_up": _block_runner_up(d, i, target)})
    best, ru = d.choice.chosen, d.choice.runner_up
    here = Candidate(plan.n_threads, plan.n_gpu_layers)
    if best.candidate != here:  # live serving settled on another measured candidate
        best, ru = next(m for m in d.measured if m.candidate == here), best
    return {
        "model": d.name, "kind": "gguf", "hash": plan.hash,
        "predicted_ms": round(plan.predicted_ms, 4),
        "measured_ms": None if plan.measured_ms is None else round(plan.measured_ms, 4),
        "unit": "ms per decoded token",
        "n_threads": plan.n_threads, "n_gpu_layers": plan.n_gpu_layers,
        "gpu_offload": d.gpu, "note": note(d),
        "prefill_tokens_per_s": _tps(best.prefill_ms_per_token),
        "decode_tokens_per_s": _tps(best.decode_ms_per_token),
        "runner_up": None if ru is None else {
            "n_threads": ru.n_threads, "n_gpu_layers": ru.n_gpu_layers,
            "predicted_ms": round(ru.decode_ms_per_token or 0.0, 4)},
        "segments": segments_of(plan.targets),
        "layers": layers, "candidates": d.choice.verdicts,
        "reason": plan.reason, "error": None, "from_cache": d.from_cache,
        "excluded": [], "monitor": {}, "live": d.live_report(),
    }


def _block_runner_up(d: GgufDispatch, i: int, target: str) -> dict[str, Any] | None:
    """Best eligible candidate that puts block ``i`` on the other device."""
    assert d.choice is not None
    n = d.info.n_layers
    best: tuple[float, str] | None = None
    for v in d.choice.verdicts:
        if not v["eligible"] or v["decode_ms_per_token"] is None:
            continue
        device = "gpu" if i >= n - v["n_gpu_layers"] else "cpu"
        other = f"llamacpp/{device}/{d.info.weight_type}"
        if other != target and (best is None or v["decode_ms_per_token"] < best[0]):
            best = (v["decode_ms_per_token"], other)
    if best is None:
        return None
    return {"target": best[1], "predicted_ms": round(best[0] / n, 4)}



def _tps(ms_per_token: float | None) -> float | None:
    return None if not ms_per_token else round(1e3 / ms_per_token, 1)
