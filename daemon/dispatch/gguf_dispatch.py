"""GGUF plans, the measuring part: time candidates on llama.cpp, choose, cache, explain.

For each candidate (n_threads, n_gpu_layers) the model is loaded with those settings and a fixed
reference request is timed a few times: a prompt prefilled in one batch, then tokens decoded one
at a time. :mod:`edgepilot.dispatch.gguf_select` picks the fastest that fits the memory budgets.
Measurements are cached in the state dir like ONNX profiles (keyed by the file's sha256, board,
profile and llama.cpp version), and the model registry loads the model with the plan's choice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepilot.backends.llamacpp import LlamaCppBackend, LlamaExecutable
from edgepilot.dispatch.gguf_select import (
    Candidate,
    Choice,
    Footprint,
    Measurement,
    candidates,
    footprint,
    select,
    thread_candidates,
)
from edgepilot.dispatch.plan_cache import PlanCache, cache_key
from edgepilot.dispatch.profiler import Progress
from edgepilot.errors import BackendError, ModelError
from edgepilot.models import files
from edgepilot.models.gguf_info import GgufInfo, read_gguf_info

log = logging.getLogger(__name__)
ROUNDS = 7


@dataclass
class GgufOptions:
    n_ctx: int = 2048
    threads: list[int] | None = None
    prompt_tokens: int = 32
    decode_tokens: int = 16


def block_weight_bytes(path: Path) -> int:
    """Bytes of the ``blk.N.*`` tensors (what offloading a block moves)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    return int(sum(int(t.n_bytes) for t in reader.tensors if t.name.startswith("blk.")))


def set_threads(exe: LlamaExecutable, n_threads: int) -> None:
    """Run ``exe`` with ``n_threads`` for decode *and* prompt batches from now on.

    llama-cpp-python otherwise prefills with every core whatever ``n_threads`` says, so a plan
    that chose fewer threads would only half apply.
    """
    import llama_cpp

    llm = exe.llm
    with exe.lock:
        llama_cpp.llama_set_n_threads(llm.ctx, n_threads, n_threads)
        llm.n_threads = llm.n_threads_batch = n_threads
        llm.context_params.n_threads = llm.context_params.n_threads_batch = n_threads


def measure(backend: LlamaCppBackend, path: Path, info: GgufInfo, n_gpu_layers: int,
            threads: list[int], prompt_tokens: int, decode_tokens: int,
            rounds: int = ROUNDS) -> list[Measurement]:
    """Load ``path`` once with ``n_gpu_layers`` and time the reference request for every
    thread count, interleaved round by round so that load on a shared board hits all alike;
    per-token medians over ``rounds``."""
    # a short context: speed at the start of a conversation, and little memory while measuring
    n_ctx = prompt_tokens + decode_tokens + 8
    try:
        exe = backend.open(path, n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, info=info)
    except BackendError as exc:
        return [Measurement(t, n_gpu_layers, None, None, exc.message) for t in threads]
    try:
        llm = exe.llm
        vocab = int(llm.n_vocab())
        prompt = [(17 + 31 * i) % vocab for i in range(prompt_tokens)]
        nxt = [(5 + 7 * i) % vocab for i in range(decode_tokens)]
        prefill: dict[int, list[float]] = {t: [] for t in threads}
        decode: dict[int, list[float]] = {t: [] for t in threads}
        for r in range(rounds + 1):  # round 0 warms the caches and is not counted
            for t in threads:
                set_threads(exe, t)
                llm.reset()
                t0 = time.perf_counter()
                llm.eval(prompt)
                t1 = time.perf_counter()
                for tok in nxt:
                    llm.eval([tok])
                t2 = time.perf_counter()
                if r:
                    prefill[t].append((t1 - t0) * 1e3 / prompt_tokens)
                    decode[t].append((t2 - t1) * 1e3 / decode_tokens)
        return [Measurement(t, n_gpu_layers, statistics.median(prefill[t]),
                            statistics.median(decode[t])) for t in threads]
    finally:
        exe.close()


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


class GgufDispatch:
    """Plans one GGUF model; the same surface the dispatcher uses for tensor models."""

    builder = None  # no per-layer cost tables: fault/drift replans do not apply

    def __init__(self, name: str, path: Path, backend: LlamaCppBackend, opts: GgufOptions, *,
                 cache: PlanCache | None = None, key_parts: dict[str, Any] | None = None,
                 budgets: dict[str, float] | None = None, progress: Progress | None = None,
                 emit: Callable[..., Any] | None = None) -> None:
        self.name = name
        self.path = Path(path)
        self.backend = backend
        self.opts = opts
        self.cache = cache
        self.key_parts = dict(key_parts or {})
        self.budgets = dict(budgets or {})
        self.progress = progress
        self.emit = emit or (lambda kind, **fields: None)
        self.info = read_gguf_info(self.path)
        self.gpu = backend.gpu_offload()
        self.plan: GgufPlan | None = None
        self.choice: Choice | None = None
        self.measured: list[Measurement] = []
        self.from_cache = False
        self._lock = threading.RLock()

    # ---- planning -----------------------------------------------------------------------------
    def _key(self) -> str:
        return cache_key({**self.key_parts, "kind": "gguf",
                          "model_sha256": files.sha256_of(self.path),
                          "candidates": [[c.n_threads, c.n_gpu_layers] for c in self._cands()],
                          "prompt_tokens": self.opts.prompt_tokens,
                          "decode_tokens": self.opts.decode_tokens,
                          "settings": self.backend.settings.model_dump(mode="json")})

    def _cands(self) -> list[Candidate]:
        threads = thread_candidates(os.cpu_count() or 1, self.backend.settings.n_threads,
                                    self.opts.threads)
        return candidates(self.info.n_layers, self.gpu, threads)

    def load_cached(self) -> GgufPlan | None:
        """The plan from cached measurements, without measuring; None when nothing is cached."""
        with self._lock:
            if self.plan is not None:
                return self.plan
            if self.cache is None:
                return None
            data = self.cache.load(self.name, self._key())
            if data is None:
                return None
            self.measured = [Measurement.from_dict(m) for m in data["measurements"]]
            self.from_cache = True
            return self._choose("cache", data.get("confirm_ms"))

    def prepare(self, reprofile: bool = False) -> GgufPlan:
        """Measure every candidate (or load them from the cache) and choose."""
        with self._lock:
            if not reprofile:
                self.plan = None
                cached = self.load_cached()
                if cached is not None:
                    return cached
            cands = self._cands()
            layers = sorted({c.n_gpu_layers for c in cands})
            self.measured = []
            for k, ngl in enumerate(layers):
                threads = sorted({c.n_threads for c in cands if c.n_gpu_layers == ngl})
                self.measured += measure(self.backend, self.path, self.info, ngl, threads,
                                         self.opts.prompt_tokens, self.opts.decode_tokens)
                if self.progress:
                    self.progress(k + 1, len(layers) + 1, f"{self.name}: n_gpu_layers {ngl}, "
                                  f"threads {threads}")
            self.from_cache = False
            plan = self._choose("reprofile" if reprofile else "initial", None)
            confirm = measure(self.backend, self.path, self.info, plan.n_gpu_layers,
                              [plan.n_threads], self.opts.prompt_tokens,
                              self.opts.decode_tokens)[0]
            if self.progress:
                self.progress(len(layers) + 1, len(layers) + 1, f"{self.name}: check")
            plan.measured_ms = confirm.decode_ms_per_token
            if self.cache is not None:
                self.cache.store(self.name, self._key(), {
                    "model": self.name, "kind": "gguf", "parts": self.key_parts,
                    "measurements": [m.as_dict() for m in self.measured],
                    "confirm_ms": plan.measured_ms})
            return plan

    def _footprints(self) -> dict[Candidate, Footprint]:
        blocks = block_weight_bytes(self.path)
        kv = self.backend.settings.kv_cache_type
        return {m.candidate: footprint(self.info, blocks, m.n_gpu_layers, self.opts.n_ctx, kv)
                for m in self.measured}

    def _choose(self, reason: str, confirm_ms: float | None) -> GgufPlan:
        choice = select(self.measured, self._footprints(), self.budgets,
                        self.opts.prompt_tokens, self.opts.decode_tokens)
        best = choice.chosen
        assert best.decode_ms_per_token is not None
        old = self.plan
        self.choice = choice
        self.plan = GgufPlan(self.name, files.sha256_of(self.path), best.n_threads,
                             best.n_gpu_layers, self._targets(best.n_gpu_layers),
                             best.decode_ms_per_token, confirm_ms, reason)
        if old is not None and old.hash != self.plan.hash:
            self.emit("plan.changed", model=self.name, hash=self.plan.hash, previous=old.hash,
                      reason=reason, predicted_ms=round(self.plan.predicted_ms, 4),
                      measured_ms=self.plan.measured_ms)
        return self.plan

    def _target(self, device: str) -> str:
        return f"llamacpp/{device}/{self.info.weight_type}"

    def _targets(self, ngl: int) -> list[str]:
        n = self.info.n_layers
        return [self._target("gpu" if i >= n - ngl else "cpu") for i in range(n)]

    def replan(self, reason: str, force: bool = False) -> tuple[bool, GgufPlan]:
        """Choose again from the measurements (budgets may have changed)."""
        with self._lock:
            if self.plan is None:
                return True, self.prepare()
            old = self.plan.hash
            plan = self._choose(reason, self.plan.measured_ms)
            return plan.hash != old, plan

    def set_clocks(self, freqs: dict[str, float], reason: str) -> tuple[bool, GgufPlan]:
        """Clock changes do not re-time llama.cpp (a replan with reprofile does)."""
        with self._lock:
            assert self.plan is not None
            return False, self.plan

    def run(self, inputs: Any) -> Any:
        raise ModelError(f"model {self.name!r} is a GGUF language model; it is served through "
                         "/v1/chat/completions, not per-layer tensor inference", field="model")

    # ---- explain ------------------------------------------------------------------------------
    def note(self) -> str:
        assert self.plan is not None
        n, ngl = self.info.n_layers, self.plan.n_gpu_layers
        threads = sorted({m.n_threads for m in self.measured})
        chosen = (f"n_threads {self.plan.n_threads} chosen from {threads} by measured "
                  f"prefill/decode speed")
        if not self.gpu:
            return f"this llama.cpp build has no GPU backend: all {n} blocks on cpu; {chosen}"
        return (f"{ngl} of {n} blocks on gpu (llama.cpp offloads the last blocks), "
                f"{n - ngl} on cpu; {chosen} under the memory budget")

    def explain(self) -> dict[str, Any]:
        """Plan JSON of issue 6 for a GGUF model: one layer entry per block."""
        with self._lock:
            if self.plan is None:
                self.prepare()
            assert self.plan is not None and self.choice is not None
            plan, n = self.plan, self.info.n_layers
            share = plan.predicted_ms / n
            layers = []
            for i, target in enumerate(plan.targets):
                layers.append({"name": f"blk.{i}", "target": target,
                               "predicted_ms": round(share, 4), "measured_ms": None,
                               "runner_up": self._block_runner_up(i, target)})
            best = self.choice.chosen
            ru = self.choice.runner_up
            return {
                "model": self.name, "kind": "gguf", "hash": plan.hash,
                "predicted_ms": round(plan.predicted_ms, 4),
                "measured_ms": None if plan.measured_ms is None else round(plan.measured_ms, 4),
                "unit": "ms per decoded token",
                "n_threads": plan.n_threads, "n_gpu_layers": plan.n_gpu_layers,
                "gpu_offload": self.gpu, "note": self.note(),
                "prefill_tokens_per_s": _tps(best.prefill_ms_per_token),
                "decode_tokens_per_s": _tps(best.decode_ms_per_token),
                "runner_up": None if ru is None else {
                    "n_threads": ru.n_threads, "n_gpu_layers": ru.n_gpu_layers,
                    "predicted_ms": round(ru.decode_ms_per_token or 0.0, 4)},
                "segments": _segments(plan.targets),
                "layers": layers, "candidates": self.choice.verdicts,
                "reason": plan.reason, "error": None, "from_cache": self.from_cache,
                "excluded": [], "monitor": {},
            }

    def _block_runner_up(self, i: int, target: str) -> dict[str, Any] | None:
        """Best eligible candidate that puts block ``i`` on the other device."""
        assert self.choice is not None
        n = self.info.n_layers
        best: tuple[float, str] | None = None
        for v in self.choice.verdicts:
            if not v["eligible"] or v["decode_ms_per_token"] is None:
                continue
            other = self._target("gpu" if i >= n - v["n_gpu_layers"] else "cpu")
            if other != target and (best is None or v["decode_ms_per_token"] < best[0]):
                best = (v["decode_ms_per_token"], other)
        if best is None:
            return None
        return {"target": best[1], "predicted_ms": round(best[0] / n, 4)}


def _tps(ms_per_token: float | None) -> float | None:
    return None if not ms_per_token else round(1e3 / ms_per_token, 1)


def _segments(targets: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, t in enumerate(targets):
        if out and out[-1]["target"] == t:
            out[-1]["layers"][1] = i + 1
        else:
            out.append({"target": t, "layers": [i, i + 1]})
    return out
