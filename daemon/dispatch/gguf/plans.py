"""GGUF plans: time candidates on llama.cpp, choose, cache, explain.

For each candidate (n_threads, n_gpu_layers) the model is loaded with those settings and a fixed
reference request is timed a few times (:mod:`.measure`): a prompt prefilled in one batch,
then tokens decoded one at a time. :mod:`.select` picks the fastest that fits the memory
budgets.
Measurements are cached in the state dir like ONNX profiles (keyed by the file's sha256, board,
profile and llama.cpp version), and the model registry loads the model with the plan's choice.

The daemon's own traffic must not bias the choice (a request decoding on the same cores makes
every thread count look slower, the larger ones most): each measuring round holds the device
queues (``hold``, from the registry), so no request runs while it is timed; candidates are
interleaved round by round, in alternating order; and when the rounds spread widely, more are
taken, up to a bound. The choice is then checked on live traffic (:mod:`.live`): the
loaded model asks this plan for its thread count before every request and reports the decode
speed it got, and a close or noisy choice is settled by trying the runner-up on real requests.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgepilot.backends.llamacpp.backend import LlamaCppBackend
from edgepilot.dispatch.gguf import explain as gguf_explain
from edgepilot.dispatch.gguf.live import LiveStats, LiveTrial, trial_reason
from edgepilot.dispatch.gguf.measure import Hold, measure
from edgepilot.dispatch.gguf.select import (
    Candidate,
    Choice,
    Footprint,
    GgufPlan,
    Measurement,
    candidates,
    footprint,
    select,
    thread_candidates,
)
from edgepilot.dispatch.measuring.measure import Progress
from edgepilot.dispatch.planning.cache import PlanCache, cache_key
from edgepilot.errors import ModelError
from edgepilot.formats import files
from edgepilot.formats.gguf_info import read_gguf_info

log = logging.getLogger(__name__)
@dataclass
class GgufOptions:
    n_ctx: int = 2048
    threads: list[int] | None = None
    prompt_tokens: int = 32
    decode_tokens: int = 16


class GgufDispatch:
    """Plans one GGUF model; the same surface the dispatcher uses for tensor models.

    It is also the :class:`~edgepilot.backends.llamacpp.backend.ThreadGovernor` of the model the
    registry loads (:meth:`serve`): that model asks it for its thread count before each request
    and reports each request's decode speed, which the live check uses.
    """

    builder = None  # no per-layer cost tables: fault/drift replans do not apply

    # one plan per GGUF model, whatever the prompt: no input-shape signature
    signature = ""

    def __init__(self, name: str, path: Path, backend: LlamaCppBackend, opts: GgufOptions, *,
                 cache: PlanCache | None = None, key_parts: dict[str, Any] | None = None,
                 budgets: dict[str, float] | None = None, progress: Progress | None = None,
                 emit: Callable[..., Any] | None = None, hold: Hold | None = None) -> None:
        self.name = name
        self.path = Path(path)
        self.backend = backend
        self.opts = opts
        self.cache = cache
        self.key_parts = dict(key_parts or {})
        self.budgets = dict(budgets or {})
        self.progress = progress
        self.emit = emit or (lambda kind, **fields: None)
        self.hold: Hold = hold or nullcontext
        self.info = read_gguf_info(self.path)
        self.gpu = backend.gpu_offload()
        self.plan: GgufPlan | None = None
        self.choice: Choice | None = None
        self.measured: list[Measurement] = []
        self.from_cache = False
        # planning holds _lock for seconds; serving threads only ever take _live_lock (a
        # request holding the device must never wait for a measurement that waits for it)
        self._lock = threading.RLock()
        self._live_lock = threading.Lock()
        self.trial: LiveTrial | None = None
        self.live = LiveStats()
        self.live_choice: int | None = None   # the thread count live serving settled on
        self._drift_checked: str | None = None  # plan hash whose drift already started a trial
        self._doc: dict[str, Any] | None = None  # the cache document, rewritten with "live"
        self._digest: tuple[list[int], str] | None = None  # (size/mtime/inode, sha256)

    # ---- planning -----------------------------------------------------------------------------
    def _stat(self) -> list[int]:
        st = self.path.stat()
        return [st.st_size, st.st_mtime_ns, st.st_ino]

    def _sha256(self) -> str:
        """The file's sha256; taken from a cached plan of this very file (same size, mtime
        and inode) when there is one, so that loading a planned model does not hash it
        (0.3 s for 100 MB here, more than llama.cpp takes to load it)."""
        stat = self._stat()
        if self.cache is not None and self._digest is None:
            for doc in self.cache.documents(self.name):
                known = doc.get("file") or {}
                if known.get("stat") == stat and isinstance(known.get("sha256"), str):
                    self._digest = (stat, known["sha256"])
                    break
        if self._digest is not None and self._digest[0] == stat:
            return self._digest[1]
        digest = files.sha256_of(self.path)
        self._digest = (stat, digest)
        return digest

    def _file_doc(self) -> dict[str, Any]:
        return {"stat": self._stat(), "sha256": self._sha256()}

    def _key(self) -> str:
        return cache_key({**self.key_parts, "kind": "gguf",
                          "model_sha256": self._sha256(),
                          "candidates": [[c.n_threads, c.n_gpu_layers] for c in self._cands()],
                          "prompt_tokens": self.opts.prompt_tokens,
                          "decode_tokens": self.opts.decode_tokens,
                          "settings": self.backend.settings.model_dump(mode="json")})

    def _cands(self) -> list[Candidate]:
        threads = thread_candidates(os.cpu_count() or 1, self.backend.settings.n_threads,
                                    self.opts.threads)
        return candidates(self.info.n_layers, self.gpu, threads)

    def load_cached(self, wait: bool = True) -> GgufPlan | None:
        """The plan from cached measurements, without measuring; None when nothing is cached.

        ``wait=False`` (a model load) does not wait for a planning in progress: it gets the
        current plan, or None, and the model picks up the new plan at its next request.
        """
        if not self._lock.acquire(blocking=wait):
            return self.plan
        try:
            if self.plan is not None:
                return self.plan
            if self.cache is None or not self.cache.has(self.name):
                return None  # nothing cached for this name: no need to hash the file
            data = self.cache.load(self.name, self._key())
            if data is None:
                return None
            self.measured = [Measurement.from_dict(m) for m in data["measurements"]]
            self.from_cache = True
            self._doc = data
            live = data.get("live") or {}
            self.live_choice = live.get("n_threads")
            return self._choose("cache", data.get("confirm_ms"))
        finally:
            self._lock.release()

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
            self.live_choice = None  # new measurements: live serving is asked again
            for k, ngl in enumerate(layers):
                threads = sorted({c.n_threads for c in cands if c.n_gpu_layers == ngl})
                self.measured += measure(self.backend, self.path, self.info, ngl, threads,
                                         self.opts.prompt_tokens, self.opts.decode_tokens,
                                         hold=self.hold)
                if self.progress:
                    self.progress(k + 1, len(layers) + 1, f"{self.name}: n_gpu_layers {ngl}, "
                                  f"threads {threads}")
            self.from_cache = False
            plan = self._choose("reprofile" if reprofile else "initial", None)
            confirm = measure(self.backend, self.path, self.info, plan.n_gpu_layers,
                              [plan.n_threads], self.opts.prompt_tokens,
                              self.opts.decode_tokens, hold=self.hold)[0]
            if self.progress:
                self.progress(len(layers) + 1, len(layers) + 1, f"{self.name}: check")
            plan.measured_ms = confirm.decode_ms_per_token
            self._doc = {"model": self.name, "kind": "gguf", "parts": self.key_parts,
                         "file": self._file_doc(),
                         "measurements": [m.as_dict() for m in self.measured],
                         "confirm_ms": plan.measured_ms}
            if self.cache is not None:
                self.cache.store(self.name, self._key(), self._doc)
            return plan

    def _footprints(self) -> dict[Candidate, Footprint]:
        blocks = self.info.block_bytes
        kv = self.backend.settings.kv_cache_type
        return {m.candidate: footprint(self.info, blocks, m.n_gpu_layers, self.opts.n_ctx, kv)
                for m in self.measured}

    def _choose(self, reason: str, confirm_ms: float | None) -> GgufPlan:
        choice = select(self.measured, self._footprints(), self.budgets,
                        self.opts.prompt_tokens, self.opts.decode_tokens)
        best = choice.chosen
        settled = self._settled(choice)
        if settled is not None:  # live serving already compared these two: its word stands
            best = settled
        assert best.decode_ms_per_token is not None
        old = self.plan
        plan = GgufPlan(self.name, self._sha256(), best.n_threads,
                        best.n_gpu_layers, self._targets(best.n_gpu_layers),
                        best.decode_ms_per_token, confirm_ms, reason)
        why = None if settled is not None else trial_reason(
            choice.chosen, choice.runner_up, self.opts.prompt_tokens, self.opts.decode_tokens)
        with self._live_lock:
            self.choice = choice
            self.plan = plan
            self.trial = None
            if why is not None and choice.runner_up is not None:
                self.trial = LiveTrial(best.n_threads, choice.runner_up.n_threads, why)
                log.info("%s: GGUF plan %s; trying %d threads on live traffic too (%s)",
                         self.name, plan.hash, choice.runner_up.n_threads, why)
        if old is not None and old.hash != plan.hash:
            self.emit("plan.changed", model=self.name, hash=plan.hash, previous=old.hash,
                      reason=reason, predicted_ms=round(plan.predicted_ms, 4),
                      measured_ms=plan.measured_ms)
        return plan

    def _settled(self, choice: Choice) -> Measurement | None:
        """The eligible measurement live serving chose (same GPU layers as the choice)."""
        if self.live_choice is None:
            return None
        for v, m in zip(choice.verdicts, self.measured, strict=True):
            if (m.n_threads == self.live_choice and m.n_gpu_layers == choice.chosen.n_gpu_layers
                    and v["eligible"]):
                return m
        return None

    # ---- live serving -------------------------------------------------------------------------
    def threads_for_request(self) -> int | None:
        with self._live_lock:
            if self.plan is None:
                return None
            if self.trial is not None and not self.trial.done:
                return self.trial.next_threads()
            return self.plan.n_threads

    def observed(self, n_threads: int, decode_ms_per_token: float, tokens: int) -> None:
        """One served request's decode speed: counted, and fed to the trial in progress (or
        a drifting choice starts one). A trial that settles on the runner-up switches the
        plan: ``plan.changed`` with reason ``live``, recorded in the plan cache."""
        with self._live_lock:
            self.live.observe(n_threads, decode_ms_per_token, tokens)
            plan, trial = self.plan, self.trial
            if plan is None:
                return
            if trial is None or trial.done:
                self._check_drift(plan)
                return
            winner = trial.observe(n_threads, decode_ms_per_token, tokens)
            if winner is None:
                return
            self.live_choice = winner
            log.info("%s: live trial %s", self.name, trial.as_dict())
            switched = self._switch(plan, winner) if winner != plan.n_threads else None
        self._record_live(trial)
        if switched is not None:
            self.emit("plan.changed", model=self.name, hash=switched.hash, previous=plan.hash,
                      reason="live", n_threads=switched.n_threads,
                      previous_n_threads=plan.n_threads,
                      predicted_ms=round(switched.predicted_ms, 4),
                      measured_ms=switched.measured_ms,
                      observed_ms={str(t): round(statistics.median(v), 4)
                                   for t, v in trial.samples.items()})

    def _check_drift(self, plan: GgufPlan) -> None:
        # under _live_lock: serving slower than predicted starts one trial of the runner-up
        ru = self.choice.runner_up if self.choice is not None else None
        if (ru is None or self._drift_checked == plan.hash or ru.n_threads == plan.n_threads
                or ru.n_gpu_layers != plan.n_gpu_layers):
            return
        ratio = self.live.drifted(plan.n_threads, plan.predicted_ms)
        if ratio is None:
            return
        self._drift_checked = plan.hash
        self.trial = LiveTrial(plan.n_threads, ru.n_threads,
                               f"live decode {ratio:.2f}x the predicted {plan.predicted_ms:.2f} "
                               "ms/token")

    def _switch(self, plan: GgufPlan, n_threads: int) -> GgufPlan:
        # under _live_lock: the plan with the thread count live serving found faster
        m = next(x for x in self.measured
                 if x.n_threads == n_threads and x.n_gpu_layers == plan.n_gpu_layers)
        assert m.decode_ms_per_token is not None
        self.plan = replace(plan, n_threads=n_threads, predicted_ms=m.decode_ms_per_token,
                            measured_ms=self.live.median_ms(n_threads), reason="live")
        return self.plan

    def _record_live(self, trial: LiveTrial) -> None:
        """Keep the live verdict with the cached measurements: a restart does not redo it."""
        if self.cache is None or self._doc is None:
            return
        doc = {**self._doc, "live": {"n_threads": trial.winner, "trial": trial.as_dict()}}
        try:
            self.cache.store(self.name, self._key(), doc)
            self._doc = doc
        except OSError as exc:  # the verdict still holds for this run
            log.warning("%s: could not record the live trial in the plan cache: %s",
                        self.name, exc)

    def live_report(self) -> dict[str, Any]:
        """What serving observed and what the live check did (plan JSON ``live``)."""
        with self._live_lock:
            return {"observed": self.live.as_dict(),
                    "trial": None if self.trial is None else self.trial.as_dict(),
                    "settled_n_threads": self.live_choice}

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

    # ---- explain (explain.py) ----------------------------------------------------------------
    def note(self) -> str:
        """One sentence on where the blocks run and how the thread count was chosen."""
        return gguf_explain.note(self)

    def explain(self) -> dict[str, Any]:
        """Plan JSON for a GGUF model: one layer entry per block."""
        with self._lock:
            if self.plan is None:
                self.prepare()
            return gguf_explain.explain(self)
