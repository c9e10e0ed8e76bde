"""The model registry: which models are resident, and on what.

Which models exist is the :class:`~edgepilot.formats.catalog.ModelCatalog`'s: ``[[models]]``
config entries and files dropped in the model dir (named by their stem). Loading verifies the
file (inside the model dir, sha256 when pinned), estimates its memory (GGUF: weights + KV
cache; ONNX/TFLite: model + packed weights + peak activations, see
:mod:`edgepilot.formats.memory`) against the budget, and compiles it whole on its default
target. Compiled plan executables count against the same budget: a load that does not fit
first evicts what is idle, least recently used first (a log line each), and is refused with the
numbers only when that is not enough. ``[serving] max_loaded_models`` bounds how many models are
resident whole: a load past it unloads the least recently used idle one, never one with requests
in flight (it waits for one to finish, then answers 503). Resident models are unloaded after
their keep-alive of idleness and reloaded on the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import psutil

from edgepilot.backends.backend_set import BackendSet
from edgepilot.backends.base import Backend, Executable
from edgepilot.backends.llamacpp.backend import LlamaCppBackend
from edgepilot.blocking import RunBlocking
from edgepilot.config import Config
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.gguf.plans import GgufDispatch
from edgepilot.errors import BackendError, BusyError, EdgepilotError, ModelError
from edgepilot.formats import files
from edgepilot.formats.catalog import ModelCatalog
from edgepilot.formats.gguf_info import GgufInfo, read_gguf_info
from edgepilot.formats.memory import tensor_memory
from edgepilot.serving import whole
from edgepilot.serving.devices import DeviceQueues
from edgepilot.serving.loaded import LoadedModel, ModelTooLarge, any_released
from edgepilot.serving.num_ctx import NumCtxLimit, num_ctx_limit

__all__ = ["LoadedModel", "ModelRegistry", "ModelTooLarge"]

log = logging.getLogger(__name__)
MiB = 1024 * 1024


class ModelRegistry:
    """Resident models, the memory budget. Async methods run on the daemon loop."""

    def __init__(self, config: Config, *, catalog: ModelCatalog, backends: BackendSet,
                 devices: DeviceQueues, emit: Callable[..., object], run_blocking: RunBlocking,
                 dispatcher: Dispatcher | None = None) -> None:
        """``dispatcher``: its plan executables count in the memory budget (and are evicted
        like idle models); GGUF models load with its plan's settings. None: no planning."""
        self.config = config
        self.catalog = catalog
        self.backends = backends
        self.devices = devices
        self.emit = emit
        self.run_blocking = run_blocking
        self.dispatcher = dispatcher
        self.loaded: dict[str, LoadedModel] = {}
        self.errors: dict[str, str] = {}
        self._load_locks: dict[str, asyncio.Lock] = {}
        self._loading: set[str] = set()  # past _make_slot, not yet in self.loaded

    def reload(self, config: Config) -> None:
        """A reloaded config: its budget and entries from now on (the catalog's too)."""
        self.config = config
        self.catalog.reload(config.model_dir, config.models)

    def listing(self) -> list[dict[str, Any]]:
        """Plain data for ``model.list`` and ``/v1/models``."""
        out = []
        planned: dict[str, int] = {}  # models served through their plan's executables
        for (model, _), size in self._plans():
            planned[model] = planned.get(model, 0) + size
        for name, entry in sorted(self.catalog.entries().items()):
            item: dict[str, Any] = {"name": name, "file": str(entry.file), "kind": entry.kind,
                                    "loaded": name in self.loaded or name in planned}
            if name in planned:
                item["plan_memory_bytes"] = planned[name]
            try:
                item["kind"] = files.kind_of(entry)
            except ModelError as exc:
                item["error"] = exc.message
            lm = self.loaded.get(name)
            if lm is not None:
                item.update(target=str(lm.executable.target), memory_bytes=lm.memory_bytes,
                            idle_s=round(time.monotonic() - lm.last_used, 3),
                            expires_at=lm.expires_at(),
                            # a model in a worker process (GGUF isolation): which one; else None
                            worker_pid=lm.executable.worker_pid)
            if name in self.errors:
                item["error"] = self.errors[name]
            out.append(item)
        return out

    def prepare_loads(self) -> None:
        """Once the daemon is ready (blocking): what lets a first load pay only the runtime's
        own load — a spare llama.cpp worker when the catalog holds a GGUF, and the GGUF headers
        read (a load's memory estimate reads them)."""
        ggufs = []
        for name, entry in self.catalog.entries().items():
            with contextlib.suppress(EdgepilotError):  # a bad entry: its load says why
                if files.kind_of(entry) == "gguf":
                    ggufs.append(self.catalog.resolve(name).path)
        if ggufs:
            self.backends.start_spares({"gguf"})
        for path in ggufs:
            with contextlib.suppress(EdgepilotError):
                read_gguf_info(path)

    # ---- backends ------------------------------------------------------------------------------
    def backend(self, name: str) -> Backend:
        """Backend instance by name (one per runtime, shared with the dispatcher)."""
        return self.backends.get(name)

    def backend_names(self) -> list[str]:
        """Installed, enabled backends (for status)."""
        return self.backends.names()

    # ---- memory --------------------------------------------------------------------------------
    def budget_bytes(self) -> int:
        mb = self.config.backends.memory_budget_mb
        if mb:
            return mb * MiB
        # what we hold is already missing from "available"; count it back in
        return int(0.8 * (psutil.virtual_memory().available + self.held_bytes()))

    def _plans(self) -> list[tuple[tuple[str, str], int]]:
        return self.dispatcher.resident() if self.dispatcher is not None else []

    def held_bytes(self, but: str | None = None) -> int:
        """Memory of every resident executable: whole models and plan segments."""
        return (sum(m.memory_bytes for n, m in self.loaded.items() if n != but)
                + sum(b for _, b in self._plans()))

    def _estimate(self, model: files.ResolvedModel, n_ctx: int) -> tuple[int, str]:
        """Blocking: the memory a whole-model load needs, and how that was counted."""
        files.verify(model)
        if model.kind == "gguf":
            info = read_gguf_info(model.path)
            llama = self._llama()
            kv = llama.settings.kv_cache_type
            need, detail = info.estimate_bytes(n_ctx, kv), (
                f"weights {info.weights_bytes / MiB:.1f} MiB + KV cache "
                f"{info.kv_bytes(n_ctx, kv) / MiB:.1f} MiB = 2 x {info.n_layers} layers x "
                f"{n_ctx} ctx x {info.n_kv_heads} kv_heads x {info.head_dim} head_dim x {kv}")
            # speculative = "draft": the draft loads beside the model with the same context
            # (a parallel model does not draft; a draft refused at load is still counted)
            draft = llama.draft_path(model.path) if llama.settings.parallel == 1 else None
            try:
                d_info = read_gguf_info(draft) if draft is not None and draft.is_file() else None
            except ModelError:  # not a GGUF: the load refuses it, the model loads alone
                d_info = None
            if d_info is not None and draft is not None:
                extra = d_info.estimate_bytes(n_ctx, kv)
                need += extra
                detail += f" + draft model {draft.name} {extra / MiB:.1f} MiB"
            return need, detail
        memory = tensor_memory(model.path, model.kind)  # model + packed weights + activations
        return memory.total_bytes, memory.detail()

    async def _make_room(self, name: str, need: int, detail: str) -> None:
        """Evict idle executables (least recently used first) until ``need`` fits the budget;
        ModelTooLarge with the numbers when it cannot."""
        while True:
            budget = self.budget_bytes()
            held = self.held_bytes(but=name)
            if held + need <= budget:
                return
            victim = self._idle_lru(name)
            if victim is None:
                raise ModelTooLarge(
                    f"model {name!r} needs ~{need / MiB:.1f} MiB ({detail}); {held / MiB:.1f} "
                    f"MiB already loaded and the budget is {budget / MiB:.1f} MiB; unload a "
                    "model, lower n_ctx, or raise [backends] memory_budget_mb", field="model")
            model, sig, size, idle = victim
            what = f"model {model}" if sig is None else f"the plan of {model} for {sig or '-'}"
            log.info("memory budget: evicting %s (%.1f MiB, idle %.0f s) to load %s", what,
                     size / MiB, idle, name)
            if sig is None:
                await self.unload(model, reason="memory_budget")
            elif self.dispatcher is not None:
                self.dispatcher.drop((model, sig), reason=f"memory budget, to load {name}")

    async def _make_slot(self, name: str) -> None:
        """Unload idle models (least recently used first) until loading ``name`` keeps at most
        ``[serving] max_loaded_models`` resident; while every one has requests in flight, wait
        up to ``load_wait_s`` for one to finish, then BusyError (503)."""
        serving = self.config.serving
        limit = serving.max_loaded_models
        deadline = time.monotonic() + serving.load_wait_s
        while limit:
            others = (set(self.loaded) | self._loading) - {name}
            if len(others) < limit:
                return
            idle = sorted((lm.last_used, n) for n, lm in self.loaded.items()
                          if n != name and lm.in_use == 0)
            if idle:
                last, victim = idle[0]
                log.info("[serving] max_loaded_models = %d: unloading %s (idle %.0f s) to load "
                         "%s", limit, victim, time.monotonic() - last, name)
                await self.unload(victim, reason="max_loaded_models")
                continue
            left = deadline - time.monotonic()
            busy = [lm for n, lm in self.loaded.items() if n != name]
            if left > 0 and busy:
                await any_released(busy, left)
            elif left > 0:  # only other loads under way: they soon hold a request or idle
                await asyncio.sleep(min(0.05, left))
            else:
                raise BusyError(
                    f"cannot load model {name!r}: [serving] max_loaded_models is {limit} and "
                    f"every loaded model ({', '.join(sorted(others))}) still had requests in "
                    f"flight after {serving.load_wait_s:g} s (load_wait_s); retry later or "
                    "raise max_loaded_models", field="model")

    def _idle_lru(self, but: str) -> tuple[str, str | None, int, float] | None:
        """The idle executable used longest ago: whole models first by last use, then the
        dispatcher's least recently used plan."""
        now = time.monotonic()
        idle = sorted(((lm.last_used, n, lm) for n, lm in self.loaded.items()
                       if n != but and lm.in_use == 0), key=lambda t: t[0])
        if idle:
            last, n, lm = idle[0]
            return n, None, lm.memory_bytes, now - last
        plans = [(k, b) for k, b in self._plans() if k[0] != but]
        if plans:
            (model, sig), size = plans[0]
            return model, sig, size, 0.0
        return None

    # ---- loading -------------------------------------------------------------------------------
    def _llama(self) -> LlamaCppBackend:
        llama = self.backend("llamacpp")
        assert isinstance(llama, LlamaCppBackend)
        return llama

    def _compile(self, model: files.ResolvedModel, n_ctx: int) -> Executable:
        """Blocking: compile whole on the default target (GGUF: with its plan's settings)."""
        if model.kind == "gguf":
            return self._open_gguf(model, n_ctx)
        return self.compile_whole(model)

    def _open_gguf(self, model: files.ResolvedModel, n_ctx: int) -> Executable:
        """Load with the GGUF plan's offload and threads when one is planned or cached, the plan
        governing the loaded model: it sets its thread count per request and watches its
        decode speed."""
        info: GgufInfo = read_gguf_info(model.path)
        llama = self._llama()
        gd = self._gguf_plan(model.name)
        plan = None
        if gd is not None:
            try:
                plan = gd.load_cached(wait=False)
            except Exception as exc:  # a broken cache must not stop the model from loading
                log.warning("no GGUF plan for %s (%s); loading with the configured settings",
                            model.name, exc)
        # [backends.llamacpp] isolation: a worker process (default) or the llama.cpp thread
        exe = llama.open_served(model.path, model=model.name, n_ctx=n_ctx, info=info,
                                n_gpu_layers=None if plan is None else plan.n_gpu_layers,
                                n_threads=None if plan is None else plan.n_threads,
                                emit=self.emit, governor=gd,
                                adapters=files.adapter_paths(self.catalog.model_dir,
                                                             model.entry))
        if plan is not None:
            log.info("%s: GGUF plan %s (n_threads %d, n_gpu_layers %d)", model.name, plan.hash,
                     plan.n_threads, plan.n_gpu_layers)
        return exe

    def _gguf_plan(self, name: str) -> GgufDispatch | None:
        if self.dispatcher is None or not self.config.dispatch.enabled:
            return None
        try:
            md = self.dispatcher.get(name)
        except Exception as exc:  # planning state is optional; the model still loads
            log.warning("no GGUF plan for %s (%s); loading with the configured settings",
                        name, exc)
            return None
        return md if isinstance(md, GgufDispatch) else None

    def compile_whole(self, model: files.ResolvedModel) -> Executable:
        """The whole model on its default target (:func:`.whole.compile_whole`)."""
        return whole.compile_whole(self.backends, model)

    async def load(self, name: str, num_ctx: int | None = None) -> LoadedModel:
        """Make ``name`` resident (no-op when it is); emits ``model.loaded``. ``num_ctx``
        (a GGUF's context per request, Ollama's ``options.num_ctx``): a copy loaded with
        another context is reloaded with this one once its requests are done (400 naming
        ``options.num_ctx`` past what the model and the budget allow, see :mod:`.num_ctx`)."""
        lm = self.loaded.get(name)
        if lm is not None and (num_ctx is None or lm.n_ctx == self._total_ctx(lm.model, num_ctx)):
            return lm
        model = self.catalog.resolve(name)  # unknown names are a 404 before anything is kept
        lock = self._load_locks.setdefault(name, asyncio.Lock())
        async with lock:
            n_ctx = 0 if model.kind != "gguf" else \
                model.entry.n_ctx or self._llama().settings.n_ctx
            if num_ctx is not None and model.kind == "gguf":
                limit = await self.num_ctx_limit(model)
                limit.check(name, num_ctx)
                n_ctx = self._total_ctx(model, num_ctx)
            lm = self.loaded.get(name)
            if lm is not None and (num_ctx is None or lm.n_ctx == n_ctx):
                return lm
            if lm is not None:  # another context asked: as an unload, after its requests
                log.info("%s: reloading with n_ctx %d (was %d) for a request's "
                         "options.num_ctx", name, n_ctx, lm.n_ctx)
                await self.unload(name, reason="num_ctx")
            started = time.monotonic()
            try:
                need, detail = await self.run_blocking(self._estimate, model, n_ctx)
                await self._make_slot(name)
                self._loading.add(name)
                await self._make_room(name, need, detail)
                exe = await self.run_blocking(self._compile, model, n_ctx)
            except (ModelError, BackendError) as exc:
                self.errors[name] = exc.message
                raise
            finally:
                self._loading.discard(name)
            self.errors.pop(name, None)
            need = need if model.kind == "gguf" else max(need, exe.memory_bytes)
            lm = self.loaded[name] = LoadedModel(model, exe, need, n_ctx=n_ctx)
            self.emit("model.loaded", model=name, format=model.kind, target=str(exe.target),
                      memory_bytes=need, load_ms=round((time.monotonic() - started) * 1000, 1),
                      **(exe.load_split or {}))
            return lm

    def _total_ctx(self, model: files.ResolvedModel, num_ctx: int) -> int:
        """The context a GGUF is loaded with for a request's ``num_ctx`` (each of its
        ``parallel`` sequences gets that much); 0 for a tensor model, which has none."""
        return num_ctx * self._llama().settings.parallel if model.kind == "gguf" else 0

    async def num_ctx_limit(self, model: files.ResolvedModel) -> NumCtxLimit:
        """The largest ``options.num_ctx`` GGUF ``model`` may be loaded with now."""
        info = await self.run_blocking(read_gguf_info, model.path)
        settings = self._llama().settings
        busy = sum(lm.memory_bytes for n, lm in self.loaded.items()
                   if n != model.name and lm.in_use > 0)
        return num_ctx_limit(info, budget=self.budget_bytes(), busy=busy,
                             parallel=settings.parallel, kv_type=settings.kv_cache_type)

    async def unload(self, name: str, reason: str = "request") -> bool:
        """Release ``name``; False when it was not loaded.

        New requests load a fresh copy at once; requests that already hold this copy finish on
        it first (closing it under them would crash the runtime), then it is closed.
        """
        lm = self.loaded.get(name)
        if lm is None:
            self.catalog.entry(name)  # unknown names are a 404, known-but-idle ones just False
            return False
        self.loaded.pop(name, None)
        while lm.in_use > 0:
            lm.released.clear()
            await lm.released.wait()
        async with self.devices.for_target(str(lm.executable.target)).slot(limit=False):
            await self.run_blocking(lm.executable.close)
        self.emit("model.unloaded", model=name, reason=reason)
        return True

    async def acquire(self, name: str) -> LoadedModel:
        """The loaded model (loading on demand), marked in use until :meth:`release`."""
        lm = await self.load(name)
        lm.in_use += 1
        lm.last_used = time.monotonic()
        return lm

    def release(self, lm: LoadedModel) -> None:
        lm.in_use -= 1
        lm.last_used = time.monotonic()
        lm.released.set()

    async def reap(self) -> list[str]:
        """Unload models idle longer than their keep-alive; returns their names."""
        now = time.monotonic()
        idle = [n for n, lm in self.loaded.items()
                if lm.in_use == 0 and now - lm.last_used >= lm.keep_alive()]
        for name in idle:
            lm = self.loaded.get(name)
            if lm is not None and lm.in_use == 0:
                await self.unload(name, reason="keep_alive")
        return idle

    async def close(self) -> None:
        for name in list(self.loaded):
            try:
                await self.unload(name, reason="shutdown")
            except Exception:
                log.exception("unloading %s at shutdown failed", name)
