"""The dispatcher the daemon, HTTP, MQTT and CLI talk to: one :class:`ModelDispatch` per model.

``for_request(model, inputs)`` finds the dispatch state whose plan serves a request (the
serving layer runs it, segment by segment, holding each segment's device); ``plan_for(model)``
returns the plan JSON (planning first when needed); ``replan`` and ``clocks_changed`` move
plans when an operator or the board asks. Blocking work runs through ``run_blocking``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from edgepilot import __version__
from edgepilot.backends.backend_set import BackendSet
from edgepilot.backends.base import Backend, BackendUnavailable, Target
from edgepilot.backends.llamacpp.backend import LlamaCppBackend
from edgepilot.blocking import RunBlocking
from edgepilot.board.board import Board
from edgepilot.config import Config
from edgepilot.dispatch.background import BackgroundPlans
from edgepilot.dispatch.gguf.plans import GgufDispatch
from edgepilot.dispatch.gguf.setup import gguf_dispatch
from edgepilot.dispatch.graph.signature import Shapes, shapes_of, signature_of
from edgepilot.dispatch.links import ActiveProfile
from edgepilot.dispatch.measuring.measure import Progress
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch
from edgepilot.dispatch.model_files import PLANNED_KINDS, planning_shapes
from edgepilot.dispatch.planning.cache import PlanCache
from edgepilot.dispatch.planning.corpus import CorpusStores
from edgepilot.dispatch.planning.kernels import KernelModel
from edgepilot.dispatch.planning.plan import segments_of
from edgepilot.dispatch.targets import (
    available_targets,
    board_freqs,
    board_id,
    memory_budgets,
    runtime_versions,
)
from edgepilot.errors import EdgepilotError, ModelError, PlanError
from edgepilot.formats.catalog import ModelCatalog

log = logging.getLogger(__name__)
AnyDispatch: TypeAlias = "ModelDispatch | GgufDispatch"


class Dispatcher:
    """Per-layer plans for every tensor model this daemon (or CLI run) serves."""

    def __init__(self, config: Config, *, board: Board | None = None,
                 profiles: ActiveProfile | None = None, catalog: ModelCatalog | None = None,
                 emit: Callable[..., Any] | None = None,
                 run_blocking: RunBlocking | None = None, progress: Progress | None = None,
                 backends: dict[str, Backend] | None = None,
                 backend_set: BackendSet | None = None,
                 hold_devices: Callable[[], AbstractContextManager[Any]] | None = None,
                 plan_cache: PlanCache | None = None) -> None:
        """``catalog``: where model names are looked up (the daemon's, shared with its model
        registry; else one over the config that also takes model file paths, as the CLI
        does). ``hold_devices``: held around each timed round, so no request runs meanwhile
        (the daemon's device queues). ``plan_cache``: the daemon's, shared with the fleet."""
        self.config, self.board, self.profiles = config, board, profiles
        self.catalog = catalog or ModelCatalog(config.model_dir, config.models, paths=True)
        self.hold_devices = hold_devices
        self.emit = emit or (lambda kind, **fields: None)
        self.run_blocking: RunBlocking = run_blocking or asyncio.to_thread
        self._user_progress = progress
        # set on stop: profiling checks it at every step, so a stopping daemon does not wait
        # for a long measurement in a worker thread
        self.cancelled = False
        self.cache = plan_cache or PlanCache(config.state_dir / "plans")
        self._backends = backends
        # the daemon passes its one BackendSet; a CLI run builds its own
        self.backend_set = backend_set or BackendSet(
            config.backends.options_of, config.backends.enabled,
            config.state_dir / "cache")
        # (model, input-shape signature) -> its dispatch state, least recently used first;
        # a GGUF model has one entry with an empty signature
        self._models: OrderedDict[tuple[str, str], AnyDispatch] = OrderedDict()
        # recent real request inputs per (model, signature), when [dispatch] sample_requests
        self._recent: dict[tuple[str, str], deque[dict[str, np.ndarray]]] = {}
        self._lock = threading.Lock()
        self.corpora = CorpusStores(config.state_dir / "corpus")
        # why re-prediction ran, most recent last (status/debugging: one entry per clock move)
        self.clock_replans: deque[str] = deque(maxlen=50)
        # background planning: a request never waits for profiling (seconds to minutes)
        self.background = BackgroundPlans()
        self.plan_failures = self.background.failures

    # ---- set-up -------------------------------------------------------------------------------
    def reload(self, config: Config) -> None:
        """A reloaded config: its [dispatch] settings apply to plans made from now on."""
        self.config = config

    def progress(self, done: int, total: int, what: str) -> None:
        """Progress of profiling, passed on to the CLI's bar; aborts once cancelled."""
        if self.cancelled:
            raise PlanError("planning cancelled: the daemon is stopping")
        if self._user_progress is not None:
            self._user_progress(done, total, what)

    def _progress_of(self, key: tuple[str, str]) -> Progress:
        """Progress of one (model, signature): recorded for ``plan_progress``, then passed on."""
        return self.background.reporter(key, self.progress)

    @property
    def backends(self) -> dict[str, Backend]:
        if self._backends is None:
            self._backends = self.backend_set.tensor(
                lambda name, why: log.info("backend %s unavailable: %s", name, why))
        return self._backends

    def resolve(self, name: str) -> tuple[str, Path, float | None]:
        """Model name (or, from the CLI, a path) -> (name, verified file, tolerance override)."""
        model = self.catalog.locate(name)
        return model.name, model.path, model.entry.tolerance

    def profile_name(self) -> str | None:
        """The DVFS profile in force (None without DVFS)."""
        return self.profiles.active_name if self.profiles is not None else None

    def key_parts(self) -> dict[str, Any]:
        """What a cached plan depends on besides the model file itself."""
        return {"board": board_id(self.board),
                "profile": self.profile_name(),
                "runtimes": runtime_versions(self.backends), "edgepilot": __version__}

    def corpus_parts(self) -> dict[str, Any]:  # what the kernel corpus depends on
        return {"board": board_id(self.board), "profile": self.profile_name()}

    def kernel_models(self, targets: list[Target], progress: Progress | None = None
                      ) -> dict[str, KernelModel]:
        """Kernel-corpus fits of ``targets`` the state dir holds: the corpus (~15 s a board)
        changes no plan, only ``roofline_ms``; the daemon measures it after a background plan."""
        return self.corpora.fits(self.corpus_parts(), self.backends, targets, progress, False)

    def budgets(self) -> dict[str, float]:
        return memory_budgets(self.config)

    def llamacpp(self) -> LlamaCppBackend:
        """The llama.cpp backend with its config section; PlanError when it is unavailable."""
        try:
            backend = self.backend_set.get("llamacpp")
        except BackendUnavailable as exc:
            raise PlanError(f"cannot plan a GGUF model: {exc.message}",
                            field="backends") from None
        assert isinstance(backend, LlamaCppBackend)
        return backend

    def _gguf(self, key: str, path: Path) -> GgufDispatch:
        return gguf_dispatch(self.config, key, path, self.llamacpp(), board=self.board,
                             profile=self.profile_name(),
                             cache=self.cache, budgets=self.budgets(), progress=self.progress,
                             emit=self.emit, hold=self.hold_devices)

    def shapes_for(self, name: str, path: Path, given: Mapping[str, Sequence[int]] | None
                   ) -> Shapes:
        """The input shapes to plan ``name`` for (see ``model_files.planning_shapes``)."""
        return planning_shapes(self.config, name, path, given)

    def get(self, name: str, shapes: Mapping[str, Sequence[int]] | None = None) -> AnyDispatch:
        """The dispatch state of ``name`` for ``shapes`` (not yet planned); NotFoundError for
        unknown models, PlanError when a dynamic dim has no shape to plan for."""
        key, path, tol = self.resolve(name)
        suffix = path.suffix.lower()
        if suffix not in PLANNED_KINDS:
            raise ModelError(f"{path.name}: plans cover ONNX, TFLite and GGUF; allowed: "
                             f"{', '.join(PLANNED_KINDS)}", field="model")
        if suffix == ".gguf":
            with self._lock:
                found = self._models.get((name, ""))
                if found is not None:
                    return found
            gd = self._gguf(key, path)
            gd.progress = self._progress_of((name, ""))
            with self._lock:
                return self._models.setdefault((name, ""), gd)
        resolved = self.shapes_for(name, path, shapes)
        sig = signature_of(resolved)
        with self._lock:
            found = self._models.get((name, sig))
            if found is not None:
                self._models.move_to_end((name, sig))
                return found
        d = self.config.dispatch
        calib_dir = d.calibration_dir and self.config.model_dir / d.calibration_dir
        opts = DispatchOptions(tolerance=tol if tol is not None else d.tolerance,
                               metric=d.metric, runs=d.profile_runs, warmup=d.warmup_runs,
                               drift_threshold=d.drift_threshold, hysteresis=d.hysteresis,
                               calibration_inputs=d.calibration_inputs, max_layers=d.max_layers,
                               passes=d.profile_passes, calibration_dir=calib_dir,
                               planning_budget_s=d.planning_budget_s)
        targets = available_targets(self.backends, d.targets)
        if not targets:
            raise PlanError("no inference backend is available; run `edgepilot doctor`",
                            field="backends")
        recent = self._recent.setdefault((name, sig), deque(maxlen=max(1, d.sample_requests)))
        md = ModelDispatch(key, path, self.backends, targets, opts, cache=self.cache,
                           key_parts=self.key_parts(), freqs=board_freqs(self.board),
                           budgets=self.budgets(), progress=self._progress_of((name, sig)),
                           emit=self.emit,
                           corpus=self.kernel_models if d.kernel_corpus else None,
                           shapes=resolved, graph_dir=self.config.state_dir / "cache" / "graphs",
                           recent=lambda: list(recent))
        with self._lock:
            found = self._models.setdefault((name, sig), md)
            self._evict(name, d.max_signatures)
            return found

    def _evict(self, name: str, limit: int) -> None:
        """Drop the least recently used signatures of ``name`` beyond ``limit`` (lock held)."""
        keys = [k for k in self._models if k[0] == name]
        for k in keys[:max(0, len(keys) - limit)]:
            self._models.pop(k)
            self._recent.pop(k, None)
            self.plan_failures.pop(k, None)
            log.info("model %s: dropping the plan for shapes %s (more than %d signatures)",
                     name, k[1], limit)

    def resident(self) -> list[tuple[tuple[str, str], int]]:
        """Compiled plan executables held now, least recently used first: ((model,
        signature), bytes). They count against the serving layer's memory budget."""
        with self._lock:
            return [(k, md.compiled.memory_bytes) for k, md in self._models.items()
                    if isinstance(md, ModelDispatch) and md.compiled is not None]

    def drop(self, key: tuple[str, str], reason: str) -> bool:
        """Drop the plan state of (model, signature) and its executables (memory pressure);
        its next request is served whole while the plan is made again (from the plan cache)."""
        with self._lock:
            dropped = self._models.pop(key, None)
            self._recent.pop(key, None)
        if dropped is None:
            return False
        log.info("model %s: dropping the plan for shapes %s (%s)", key[0], key[1] or "-", reason)
        return True

    def latest(self, name: str) -> AnyDispatch:
        """The most recently used plan of ``name``, else the one for its configured shapes."""
        with self._lock:
            for (n, _sig), md in reversed(self._models.items()):
                if n == name and md.plan is not None:
                    return md
        return self.get(name)

    def prepared(self) -> list[AnyDispatch]:
        with self._lock:
            return [m for m in self._models.values() if m.plan is not None]

    def summaries(self) -> dict[str, Any]:
        """The plans in hand, planning nothing (``GET /v1/plan``, ``edgepilot top``): per model
        and input-shape signature its hash and targets per segment, least recently used first;
        the (model, signature) pairs being planned in the background, with their progress;
        those whose planning failed, with the reason."""
        with self._lock:
            held = [(n, sig, md.plan) for (n, sig), md in self._models.items()
                    if md.plan is not None]
        return {
            "plans": [{"model": n, "signature": sig or None, "hash": plan.hash,
                       "segments": segments_of(plan.targets), "reason": plan.reason}
                      for n, sig, plan in held],
            **self.background.summary(),
        }

    # ---- sync API (CLI, worker threads) -------------------------------------------------------
    def plan_for(self, name: str, shapes: Mapping[str, Sequence[int]] | None = None
                 ) -> dict[str, Any]:
        """The plan JSON of ``name`` (for ``shapes``, else its latest or configured plan);
        plans (or loads the cached profile) on first use."""
        md = self.get(name, shapes) if shapes is not None else self.latest(name)
        return md.explain()

    def for_request(self, name: str, inputs: Mapping[str, np.ndarray]) -> AnyDispatch:
        """The dispatch state for a request's own shapes. A request carries every input, so
        its shapes *are* its signature: a known one is found without resolving the model
        again (that costs file-system calls, ~70 µs, next to a 1 ms inference)."""
        key = (name, signature_of(shapes_of(inputs)))
        with self._lock:
            found = self._models.get(key)
            if found is not None:
                self._models.move_to_end(key)
                return found
        return self.get(name, shapes_of(inputs))

    # ---- async API (daemon) -------------------------------------------------------------------
    def planned(self, name: str, inputs: Mapping[str, np.ndarray] | None = None
                ) -> AnyDispatch | None:
        """The dispatch state of ``inputs``' shapes, found once per request (None: not a
        planned model). Its ``plan`` is None until one is made: the caller serves the whole
        model on its default target, then calls :meth:`plan_soon` with it, so that shapes the
        model itself refuses are never planned."""
        try:
            md = self.for_request(name, inputs) if inputs is not None else self.get(name)
        except EdgepilotError as exc:
            log.debug("no plan for %s: %s", name, exc.message)
            return None
        key = (name, md.signature)
        if inputs is not None and self.config.dispatch.sample_requests:
            recent = self._recent.get(key)
            if recent is not None:
                recent.append({k: np.array(v, copy=True) for k, v in inputs.items()})
        return md

    def plan_soon(self, name: str, md: ModelDispatch) -> None:
        """Plan ``name`` for the shapes of ``md`` (:meth:`planned`'s) in the background
        (profiling must not stall a request), unless a plan is made or being made (one per
        model: background.py) or failed (served whole; ``plan_failures``, the log)."""
        key = (name, md.signature)
        if md.plan is None and key not in self.plan_failures and not self.background.busy(name):
            self._start_planning(name, md.shapes, key)

    def _start_planning(self, name: str, shapes: Shapes | None, key: tuple[str, str]) -> None:
        async def work() -> None:
            await self.run_blocking(self.plan_for, name, shapes)
            if len(self.background.tasks) <= 1:  # the corpus it lacked; nothing else timed
                await self.run_blocking(self.corpora.measure_wanted, self.backends, self.progress)

        self.background.start(key, work)

    def plan_progress(self, name: str) -> dict[str, Any] | None:
        """None when ``name`` has a plan to explain now; else how far its plan in the making
        is (``{"state": "planning", "done", "total", "what", ...}``), planning it in the
        background for its configured shapes first when nothing is in the making.

        Never waits for profiling (``GET /v1/plan/{model}`` answers 202 with this). A plan
        that failed for those shapes is a PlanError with the reason; ``replan`` tries again.
        """
        with self._lock:
            if any(n == name and md.plan is not None for (n, _), md in self._models.items()):
                return None
        keys = self.background.in_making(name)
        if not keys:
            md = self.get(name)  # unknown model, or shapes still to give: the error says which
            if md.plan is not None:
                return None
            key = (name, md.signature)
            if key in self.plan_failures:
                raise PlanError(f"planning {name} failed: {self.plan_failures[key]}; "
                                f"POST /v1/plan/{name}/replan tries again", field="model")
            self._start_planning(name, None, key)
            keys = [key]
        return self.background.state(keys[0])

    async def plan(self, name: str, shapes: Mapping[str, Sequence[int]] | None = None
                   ) -> dict[str, Any]:
        result: dict[str, Any] = await self.run_blocking(self.plan_for, name, shapes)
        return result

    async def replan(self, name: str, reprofile: bool = False,
                     shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
        """Operator-requested replan; ``reprofile`` measures the board again first."""
        md = self.get(name, shapes) if shapes is not None else self.latest(name)
        self.plan_failures.pop((name, md.signature), None)

        def work() -> dict[str, Any]:
            if reprofile or md.plan is None:
                md.prepare(reprofile=reprofile)
            else:
                md.replan("command", force=True)
            return md.explain()

        result: dict[str, Any] = await self.run_blocking(work)
        return result

    def clocks_changed(self, reason: str, only_if_moved: bool = False) -> bool:
        """DVFS profile applied or a thermal event: re-predict every planned model (blocking).

        ``only_if_moved`` (thermal reports that changed no profile) skips models whose clocks
        are what they were planned at: a zone crossing its warning level is not a clock move,
        the kernel throttling a hot zone is. Returns whether anything was re-predicted.
        """
        freqs = board_freqs(self.board)
        models = self.prepared()
        if only_if_moved:
            # a GGUF plan is not re-timed on clock moves (its set_clocks keeps it)
            models = [md for md in models if isinstance(md, ModelDispatch) and md.freqs != freqs]
            if not models:
                return False
        self.clock_replans.append(reason)
        for md in models:
            try:
                if isinstance(md, GgufDispatch):
                    md.key_parts["profile"] = self.profile_name()
                else:
                    md.key_parts = self.key_parts()
                md.set_clocks(freqs, reason)
            except Exception:
                log.exception("replan of %s after %s failed; keeping its plan", md.name, reason)
        return True
