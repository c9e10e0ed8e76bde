"""The model registry: which models exist, which are resident, and on what.

Models come from ``[[models]]`` config entries and from files dropped in the model dir (named by
their stem). Loading verifies the file (inside the model dir, sha256 when pinned), estimates its
memory (GGUF: weights + KV cache; ONNX/TFLite: model + packed weights + peak activations, see
:mod:`edgepilot.formats.memory`) against the budget, and compiles it whole on its default
target. Resident models are unloaded after their keep-alive of idleness and reloaded on the next
request. Every request to a device goes through that device's :class:`DeviceQueue`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

from edgepilot.backends import load_backend
from edgepilot.backends.base import Backend, BackendUnavailable, Executable, Segment, Target
from edgepilot.config import Config, ModelEntry
from edgepilot.errors import BackendError, ModelError, NotFoundError
from edgepilot.formats import files
from edgepilot.formats.io import tensor_specs
from edgepilot.formats.memory import tensor_memory
from edgepilot.serving.queue import DeviceQueue, ThreadHold

if TYPE_CHECKING:
    from edgepilot.lifecycle import Daemon

log = logging.getLogger(__name__)
MiB = 1024 * 1024
# how long a measurement waits for the devices before giving up (requests keep them busy)
HOLD_TIMEOUT_S = 300.0
# default target per kind: first of these whose backend is installed and supports the file
DEFAULT_TARGETS: dict[str, list[tuple[str, str]]] = {
    "onnx": [("onnxruntime", "cpu")],
    "tflite": [("tflite", "xnnpack"), ("tflite", "cpu")],
    "gguf": [("llamacpp", "cpu")],
}


class ModelTooLarge(ModelError):
    """Loading would exceed the memory budget; the message carries the numbers."""

    code = "model_too_large"
    http_status = 507


@dataclass
class LoadedModel:
    """A resident model: its whole-model executable and bookkeeping for keep-alive."""

    model: files.ResolvedModel
    executable: Executable
    memory_bytes: int
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    in_use: int = 0
    # set on every release: unload waits on it until in_use is 0
    released: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def device(self) -> str:
        t = self.executable.target
        return f"{t.backend}/{t.device}"


class ModelRegistry:
    """Entries, resident models, per-device queues. Async methods run on the daemon loop."""

    def __init__(self, daemon: Daemon, extra: list[ModelEntry] | None = None) -> None:
        self.daemon = daemon
        self.extra = list(extra or [])
        self.loaded: dict[str, LoadedModel] = {}
        self.errors: dict[str, str] = {}
        self._backends: dict[str, Backend | None] = {}
        self._backend_errors: dict[str, str] = {}
        self._queues: dict[str, DeviceQueue] = {}
        self._load_locks: dict[str, asyncio.Lock] = {}

    @property
    def config(self) -> Config:
        return self.daemon.config  # type: ignore[no-any-return]

    # ---- what exists ---------------------------------------------------------------------------
    def entries(self) -> dict[str, ModelEntry]:
        """Config entries, then demo entries, then files dropped in the model dir."""
        configured = list(self.config.models)
        names = {e.name for e in configured}
        configured += [e for e in self.extra if e.name not in names]
        return files.discover(self.daemon.model_dir, configured)

    def entry(self, name: str) -> ModelEntry:
        entries = self.entries()
        if name not in entries:
            raise NotFoundError(f"unknown model {name!r}; available: "
                                f"{', '.join(sorted(entries)) or 'none (model dir is empty)'}",
                                field="model")
        return entries[name]

    def resolve(self, name: str) -> files.ResolvedModel:
        """The model's file (inside the model dir) and kind; NotFound/ModelError otherwise."""
        return files.resolve(self.daemon.model_dir, self.entry(name))

    def resolve_path(self, name: str) -> Path:
        """The verified file of ``name`` (inside the model dir, sha256 checked when pinned).

        This is what other components (the dispatcher) use to find a model's file.
        """
        model = self.resolve(name)
        files.verify(model)
        return model.path

    def listing(self) -> list[dict[str, Any]]:
        """Plain data for ``model.list`` and ``/v1/models``."""
        out = []
        for name, entry in sorted(self.entries().items()):
            item: dict[str, Any] = {"name": name, "file": str(entry.file), "kind": entry.kind,
                                    "loaded": name in self.loaded}
            try:
                item["kind"] = files.kind_of(entry)
            except ModelError as exc:
                item["error"] = exc.message
            lm = self.loaded.get(name)
            if lm is not None:
                item.update(target=str(lm.executable.target), memory_bytes=lm.memory_bytes,
                            idle_s=round(time.monotonic() - lm.last_used, 3))
            if name in self.errors:
                item["error"] = self.errors[name]
            out.append(item)
        return out

    # ---- backends ------------------------------------------------------------------------------
    def backend(self, name: str) -> Backend:
        """Backend instance by name (built once with its config section)."""
        if name not in self._backends:
            enabled = self.config.backends.enabled
            try:
                if enabled is not None and name not in enabled:
                    raise BackendUnavailable(f"backend {name!r} is not in [backends] enabled")
                self._backends[name] = load_backend(name, getattr(self.config.backends, name))
            except BackendUnavailable as exc:
                self._backends[name] = None
                self._backend_errors[name] = exc.message
        backend = self._backends[name]
        if backend is None:
            raise BackendUnavailable(self._backend_errors[name], field="backend")
        return backend

    def reset_backends(self) -> None:
        """Forget backend instances (their config sections changed); rebuilt on next use."""
        self._backends.clear()
        self._backend_errors.clear()

    def backend_names(self) -> list[str]:
        """Installed, enabled backends (for status)."""
        from edgepilot.backends import BACKENDS

        names = []
        for name in BACKENDS:
            try:
                self.backend(name)
                names.append(name)
            except BackendUnavailable:
                continue
        return names

    def queue(self, device: str) -> DeviceQueue:
        if device not in self._queues:
            self._queues[device] = DeviceQueue(device, self.config.http.max_queue)
        return self._queues[device]

    # ---- loading -------------------------------------------------------------------------------
    def budget_bytes(self) -> int:
        mb = self.config.backends.memory_budget_mb
        if mb:
            return mb * MiB
        # what we hold is already missing from "available"; count it back in
        held = sum(m.memory_bytes for m in self.loaded.values())
        return int(0.8 * (psutil.virtual_memory().available + held))

    def _check_budget(self, name: str, need: int, detail: str) -> None:
        held = sum(m.memory_bytes for n, m in self.loaded.items() if n != name)
        budget = self.budget_bytes()
        if held + need > budget:
            raise ModelTooLarge(
                f"model {name!r} needs ~{need / MiB:.1f} MiB ({detail}); {held / MiB:.1f} MiB "
                f"already loaded and the budget is {budget / MiB:.1f} MiB; unload a model, "
                "lower n_ctx, or raise [backends] memory_budget_mb", field="model")

    def _compile(self, model: files.ResolvedModel) -> tuple[Executable, int]:
        """Blocking: verify, estimate, compile whole on the default target."""
        files.verify(model)
        if model.kind == "gguf":
            return self._compile_gguf(model)
        memory = tensor_memory(model.path, model.kind)  # model + packed weights + activations
        need = memory.total_bytes
        self._check_budget(model.name, need, memory.detail())
        exe = self.compile_whole(model)
        return exe, max(need, exe.memory_bytes)

    def _compile_gguf(self, model: files.ResolvedModel) -> tuple[Executable, int]:
        """Blocking: estimate from the header, check the budget, load with the GGUF plan's
        offload and threads when one is planned or cached, and hand the loaded model to the
        plan, which sets its thread count per request and watches its decode speed."""
        from edgepilot.backends.llamacpp import LlamaCppBackend
        from edgepilot.formats.gguf_info import read_gguf_info

        info = read_gguf_info(model.path)
        llama = self.backend("llamacpp")
        assert isinstance(llama, LlamaCppBackend)
        n_ctx = model.entry.n_ctx or llama.settings.n_ctx
        kv = llama.settings.kv_cache_type
        need = info.estimate_bytes(n_ctx, kv)
        self._check_budget(model.name, need, (
            f"weights {info.weights_bytes / MiB:.1f} MiB + KV cache "
            f"{info.kv_bytes(n_ctx, kv) / MiB:.1f} MiB = 2 x {info.n_layers} layers x "
            f"{n_ctx} ctx x {info.n_kv_heads} kv_heads x {info.head_dim} head_dim x {kv}"))
        gd = self._gguf_dispatch(model.name)
        plan = None
        if gd is not None:
            try:
                plan = gd.load_cached(wait=False)
            except Exception as exc:  # a broken cache must not stop the model from loading
                log.warning("no GGUF plan for %s (%s); loading with the configured settings",
                            model.name, exc)
        if plan is None:
            exe = llama.open(model.path, n_ctx=n_ctx, info=info)
        else:
            # the dispatcher measured this board: load with the plan's offload and threads
            exe = llama.open(model.path, n_ctx=n_ctx, n_gpu_layers=plan.n_gpu_layers, info=info)
            exe.set_threads(plan.n_threads)
            log.info("%s: GGUF plan %s (n_threads %d, n_gpu_layers %d)", model.name, plan.hash,
                     plan.n_threads, plan.n_gpu_layers)
        if gd is not None:
            gd.serve(exe)
        return exe, need

    def _gguf_dispatch(self, name: str) -> Any:
        """The dispatcher's GGUF plan state for ``name`` (a ``GgufDispatch``), or None when
        dispatch is off or the model cannot be planned."""
        from edgepilot.dispatch.gguf_dispatch import GgufDispatch

        dispatcher = getattr(self.daemon, "dispatcher", None)
        if dispatcher is None or not self.config.dispatch.enabled:
            return None
        try:
            md = dispatcher.get(name)
        except Exception as exc:  # planning state is optional; the model still loads
            log.warning("no GGUF plan for %s (%s); loading with the configured settings",
                        name, exc)
            return None
        return md if isinstance(md, GgufDispatch) else None

    def hold_devices(self) -> AbstractContextManager[Any]:
        """For the daemon's own measurements, from a worker thread: hold every device queue
        (llama.cpp's CPU one included) for the body of a ``with``, so that no request runs
        while a round is timed (the cores are shared by every runtime). A no-op outside a
        running daemon (CLI) and on the loop's own thread, which must never block."""
        try:
            loop = self.daemon.loop
        except RuntimeError:
            return nullcontext()
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop or not loop.is_running():
            return nullcontext()

        def queues() -> list[DeviceQueue]:  # runs on the loop
            return [self.queue(n) for n in sorted({*self._queues, "llamacpp/cpu"})]

        return ThreadHold(loop, queues, HOLD_TIMEOUT_S)

    def default_target(self, model: files.ResolvedModel) -> tuple[Backend, Target, Segment]:
        """First installed target that runs the whole model (see DEFAULT_TARGETS)."""
        ins, outs = tensor_specs(model.path, model.kind)
        segment = Segment(model.path, model.kind,  # type: ignore[arg-type]
                          tuple(s.name for s in ins), tuple(s.name for s in outs), None,
                          model.name)
        reasons = []
        for backend_name, device in DEFAULT_TARGETS[model.kind]:
            try:
                backend = self.backend(backend_name)
                targets = [t for t in backend.probe() if t.device == device]
            except BackendUnavailable as exc:
                reasons.append(exc.message)
                continue
            for target in targets:
                support = backend.supports(segment, target)
                if support:
                    return backend, target, segment
                reasons.append(f"{target}: {support.reason}")
        raise BackendError(f"no installed backend can run {model.name!r}: " + "; ".join(reasons),
                           field="model")

    def compile_whole(self, model: files.ResolvedModel) -> Executable:
        backend, target, segment = self.default_target(model)
        return backend.compile(segment, target)

    async def load(self, name: str) -> LoadedModel:
        """Make ``name`` resident (no-op when it is); emits ``model.loaded``."""
        self.entry(name)  # unknown names are a 404 before anything is kept for them
        lock = self._load_locks.setdefault(name, asyncio.Lock())
        async with lock:
            if name in self.loaded:
                return self.loaded[name]
            model = self.resolve(name)
            started = time.monotonic()
            try:
                exe, need = await self.daemon.run_blocking(self._compile, model)
            except (ModelError, BackendError) as exc:
                self.errors[name] = exc.message
                raise
            self.errors.pop(name, None)
            lm = LoadedModel(model, exe, need)
            self.loaded[name] = lm
            self.daemon.events.emit("model.loaded", model=name, format=model.kind,
                                    target=str(exe.target), memory_bytes=need,
                                    load_ms=round((time.monotonic() - started) * 1000, 1))
            return lm

    async def unload(self, name: str, reason: str = "request") -> bool:
        """Release ``name``; False when it was not loaded.

        New requests load a fresh copy at once; requests that already hold this copy finish on
        it first (closing it under them would crash the runtime), then it is closed.
        """
        lm = self.loaded.get(name)
        if lm is None:
            self.entry(name)  # unknown names are a 404, known-but-idle ones just False
            return False
        self.loaded.pop(name, None)
        while lm.in_use > 0:
            lm.released.clear()
            await lm.released.wait()
        async with self.queue(lm.device).slot():
            await self.daemon.run_blocking(lm.executable.close)
        self.daemon.events.emit("model.unloaded", model=name, reason=reason)
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

    async def run_tensor(self, name: str, inputs: dict[str, np.ndarray]
                         ) -> tuple[dict[str, np.ndarray], str]:
        """Run the whole model on its default target; returns (outputs, "single:<target>")."""
        lm = await self.acquire(name)
        try:
            async with self.queue(lm.device).slot():
                outputs = await self.daemon.run_blocking(lm.executable.run, inputs)
        finally:
            self.release(lm)
        return outputs, f"single:{lm.executable.target}"

    async def reap(self) -> list[str]:
        """Unload models idle longer than their keep-alive; returns their names."""
        now = time.monotonic()
        idle = [n for n, lm in self.loaded.items()
                if lm.in_use == 0 and now - lm.last_used >= lm.model.entry.keep_alive_s]
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
