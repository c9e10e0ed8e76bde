"""GGUF plans, the pure part: candidates, their memory per device, and the choice.

A GGUF model's layers are its transformer blocks, and llama.cpp decides where they run with one
number, ``n_gpu_layers`` (the *last* N blocks go to the GPU), plus the CPU thread count. A plan
is therefore one (n_threads, n_gpu_layers) pair, chosen among measured candidates: the fastest
reference request (prompt prefill + decoded tokens) whose memory fits every device's budget.
Nothing here runs llama.cpp, so the choice can be tested on tables of measured speeds.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from edgepilot.errors import PlanError
from edgepilot.formats.gguf_info import COMPUTE_OVERHEAD_BYTES, GgufInfo


@dataclass(frozen=True)
class Candidate:
    """One llama.cpp configuration the planner may choose."""

    n_threads: int
    n_gpu_layers: int


@dataclass
class Measurement:
    """Measured speed of one candidate; ``error`` set when llama.cpp refused to load it."""

    n_threads: int
    n_gpu_layers: int
    prefill_ms_per_token: float | None
    decode_ms_per_token: float | None
    error: str | None = None
    rounds: int = 0                       # timed rounds behind the medians
    decode_spread: float | None = None    # (q3 - q1) / median of the rounds' decode ms/token

    @property
    def candidate(self) -> Candidate:
        return Candidate(self.n_threads, self.n_gpu_layers)

    def request_ms(self, prompt_tokens: int, decode_tokens: int) -> float | None:
        """Time of the reference request: prefill ``prompt_tokens``, decode ``decode_tokens``."""
        if self.prefill_ms_per_token is None or self.decode_ms_per_token is None:
            return None
        return (self.prefill_ms_per_token * prompt_tokens
                + self.decode_ms_per_token * decode_tokens)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        return cls(**data)


def spread(samples: list[float]) -> float:
    """Relative spread of repeated timings: interquartile range over the median (0 for fewer
    than two samples). Robust to one disturbed round, unlike max - min."""
    if len(samples) < 2:
        return 0.0
    ordered = sorted(samples)
    q1, med, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return (q3 - q1) / med if med > 0 else 0.0


@dataclass(frozen=True)
class Footprint:
    """Bytes a configuration keeps on each device."""

    cpu: int
    gpu: int


def thread_candidates(cores: int, configured: int = 0, listed: list[int] | None = None
                      ) -> list[int]:
    """Thread counts worth measuring: ``listed`` if given, else 1, half and all cores
    (plus the ``[backends.llamacpp] n_threads`` setting when it is set)."""
    if listed:
        return sorted(set(listed))
    cores = max(cores, 1)
    found = {1, max(cores // 2, 1), cores}
    if configured > 0:
        found.add(configured)
    return sorted(found)


def gpu_layer_candidates(n_layers: int, gpu: bool) -> list[int]:
    """``n_gpu_layers`` values worth measuring: 0 only without a GPU backend, else quarters."""
    if not gpu:
        return [0]
    return sorted({0, n_layers // 4, n_layers // 2, (3 * n_layers) // 4, n_layers})


def candidates(n_layers: int, gpu: bool, threads: list[int]) -> list[Candidate]:
    return [Candidate(t, g) for g in gpu_layer_candidates(n_layers, gpu) for t in threads]


def footprint(info: GgufInfo, block_bytes: int, n_gpu_layers: int, n_ctx: int,
              kv_type: str) -> Footprint:
    """Memory per device when the last ``n_gpu_layers`` blocks are offloaded.

    An offloaded block takes its weights and its share of the KV cache to the GPU, plus one
    compute-buffer margin there; embeddings, the output head and the other blocks stay on the
    CPU (llama.cpp keeps the token embeddings on the host).
    """
    ngl = max(0, min(n_gpu_layers, info.n_layers))
    per_block = block_bytes / info.n_layers + info.kv_bytes(n_ctx, kv_type) / info.n_layers
    moved = int(per_block * ngl)
    gpu = moved + (COMPUTE_OVERHEAD_BYTES if ngl else 0)
    return Footprint(cpu=info.estimate_bytes(n_ctx, kv_type) - moved, gpu=gpu)


def over_budget(fp: Footprint, budgets: dict[str, float]) -> str | None:
    """Why ``fp`` does not fit (None when it does); only devices with a budget are checked."""
    for device, used in (("cpu", fp.cpu), ("gpu", fp.gpu)):
        limit = budgets.get(device)
        if limit is not None and used > limit:
            return (f"{device} needs {used / 2**20:.1f} MiB, budget {limit / 2**20:.1f} MiB")
    return None


@dataclass
class Choice:
    """The chosen measurement, every candidate's verdict, and the runner-up."""

    chosen: Measurement
    runner_up: Measurement | None
    verdicts: list[dict[str, Any]]


def select(measured: list[Measurement], footprints: dict[Candidate, Footprint],
           budgets: dict[str, float], prompt_tokens: int, decode_tokens: int) -> Choice:
    """The fastest candidate (reference request time) within the memory budgets.

    Ties go to fewer GPU layers, then fewer threads (less memory moved, cores left free).
    PlanError when no candidate both loaded and fits.
    """
    ranked: list[tuple[float, int, int, Measurement]] = []
    verdicts = []
    for m in measured:
        fp = footprints[m.candidate]
        why = m.error or over_budget(fp, budgets)
        ms = m.request_ms(prompt_tokens, decode_tokens)
        if why is None and ms is None:
            why = "not measured"
        verdicts.append({**m.as_dict(), "request_ms": None if ms is None else round(ms, 4),
                         "cpu_bytes": fp.cpu, "gpu_bytes": fp.gpu,
                         "eligible": why is None, "reason": why})
        if why is None and ms is not None:
            ranked.append((ms, m.n_gpu_layers, m.n_threads, m))
    if not ranked:
        reasons = "; ".join(f"threads {v['n_threads']} n_gpu_layers {v['n_gpu_layers']}: "
                            f"{v['reason']}" for v in verdicts) or "no candidates"
        raise PlanError(f"no llama.cpp configuration fits: {reasons}; raise "
                        "[dispatch] memory_budgets_mb or [backends] memory_budget_mb, or lower "
                        "n_ctx", field="dispatch.memory_budgets_mb")
    ranked.sort(key=lambda r: (r[0], r[1], r[2]))
    chosen = ranked[0][3]
    return Choice(chosen, ranked[1][3] if len(ranked) > 1 else None, verdicts)


@dataclass
class GgufPlan:
    """The chosen configuration; ``targets`` lists each block's target like tensor plans."""

    model: str
    model_hash: str
    n_threads: int
    n_gpu_layers: int
    targets: list[str]
    predicted_ms: float            # decode ms per token, from the choosing measurement
    measured_ms: float | None      # decode ms per token, timed again after choosing
    reason: str = "initial"

    @property
    def hash(self) -> str:
        key = json.dumps([self.model_hash, self.n_threads, self.n_gpu_layers])
        return hashlib.sha256(key.encode()).hexdigest()[:10]
