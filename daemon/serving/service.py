"""Attach point of the models capability: the registry, its commands and its keep-alive reaper."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from edgepilot.backends.backend_set import BackendSet
from edgepilot.blocking import RunBlocking
from edgepilot.command_registry import CommandRegistry, NoParams
from edgepilot.config import Config, ConfigSource
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.errors import ConfigError, EdgepilotError
from edgepilot.events import EventBus
from edgepilot.formats import files
from edgepilot.formats.catalog import ModelCatalog
from edgepilot.readiness import Readiness
from edgepilot.serving.core import Serving
from edgepilot.serving.devices import DeviceQueues
from edgepilot.serving.generate import Generator
from edgepilot.serving.infer_command import register_infer
from edgepilot.serving.probes import run_selftests, target_status
from edgepilot.serving.registry import ModelRegistry
from edgepilot.serving.text_encoder import TextEncoders
from edgepilot.telemetry.work import WorkMeter

log = logging.getLogger(__name__)
REAP_INTERVAL_S = 1.0


class ModelName(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$",
                      description="Model name (see model.list).")


class ModelsService:
    """Demo models and load-at-start on start; idle unloads while running; unload all on stop."""

    name = "models"

    def __init__(self, registry: ModelRegistry, serving: Serving, *, config: ConfigSource,
                 events: EventBus, readiness: Readiness, run_blocking: RunBlocking) -> None:
        self.registry = registry
        self.catalog = registry.catalog
        self.backends = registry.backends
        self.serving = serving
        self.config = config
        self.events = events
        self.readiness = readiness
        self.run_blocking = run_blocking
        self._reaper: asyncio.Task[None] | None = None
        self._prober: asyncio.Task[None] | None = None
        self.failed: dict[str, str] = {}  # configured model -> why it did not load at start

    async def start(self) -> None:
        cfg = self.config()
        self.readiness.set("models", "loading models")
        if cfg.daemon.demo_models and not cfg.models:
            from edgepilot.formats.demo import ensure_demo_models

            self.catalog.extra = await self.run_blocking(ensure_demo_models, cfg.model_dir)
        self.events.subscribe(self._on_event)
        for entry in cfg.models:
            if not entry.load_at_start:
                continue
            try:
                await self.registry.load(entry.name)
            except EdgepilotError as exc:
                # a broken model never stops the daemon; /readyz says which and why until it
                # loads (model.load) or leaves the config
                log.error("model %s not loaded: %s", entry.name, exc.message)
                self.failed[entry.name] = exc.message
        self._reaper = asyncio.create_task(self._reap_forever(), name="models-reaper")
        self._prober = asyncio.create_task(self._probe_targets(), name="target-probes")
        self._update_ready()

    async def _probe_targets(self) -> None:
        """Run each backend target's tiny probe once (``edgepilot doctor``'s) in the
        background; ``/readyz`` shows the results and says not ready when no target passed,
        which a daemon that can load its runtimes yet compute nothing would otherwise hide."""
        self.serving.targets = {"*": "probing"}
        try:
            # the probes' thread outlives this task's cancelling: it asks whether the daemon stops
            results = await self.run_blocking(run_selftests, self.config(), None,
                                              self.backends.get, lambda: self.readiness.stopping)
        except Exception as exc:
            log.exception("backend target probes could not run")
            self.serving.targets = {"*": f"probes could not run: {exc}"}
            return
        self.serving.targets = target_status(results)
        failed = sorted(t for t, s in self.serving.targets.items() if s == "FAIL")
        if failed:
            log.warning("backend targets that failed their probe: %s (edgepilot doctor says "
                        "why)", ", ".join(failed))
        if "PASS" not in self.serving.targets.values():
            self.readiness.set("targets", "no backend target passed its probe; run "
                                             "`edgepilot doctor` for the reasons")

    def _update_ready(self) -> None:
        reason = "; ".join(f"model {n!r} failed to load: {m}"
                           for n, m in sorted(self.failed.items()))
        self.readiness.set("models", reason or None)

    def _on_event(self, event: dict[str, Any]) -> None:
        if event["type"] == "model.loaded" and self.failed.pop(event.get("model", ""), None):
            # events may come from worker threads; readiness is a plain dict assignment
            self._update_ready()

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            try:
                await self.registry.reap()
            except Exception:
                log.exception("keep-alive unload failed")

    async def stop(self) -> None:
        for task in (self._reaper, self._prober):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.registry.close()

    async def check(self, new: Config) -> None:
        """Refuse a config whose models could never load: a format that cannot be told, a file
        outside the model dir. (A file not there yet is fine: it may be copied in later.)"""
        model_dir = new.model_dir
        for entry in new.models:
            try:
                files.kind_of(entry)
                files.inside_model_dir(model_dir, entry)
            except EdgepilotError as exc:
                raise ConfigError(exc.message, field=exc.field) from None

    async def reload(self, old: Config, new: Config) -> None:
        """Unload resident models the new config no longer serves, or serves differently.

        A model whose name is gone (its ``[[models]]`` entry removed, or a dropped-in file now
        claimed by an entry under another name) is unloaded with reason "removed from config";
        one whose entry changed, with "config changed" (it reloads with the new entry on its
        next request). Unchanged models stay resident.
        """
        before = {e.name: e for e in old.models}
        after = {e.name: e for e in new.models}
        self.registry.reload(new)
        current = self.catalog.entries()
        for name in list(self.registry.loaded):
            if name not in current or (name in before and name not in after):
                reason = "removed from config"
            elif before.get(name) != after.get(name):
                reason = "config changed"
            else:
                continue
            try:
                await self.registry.unload(name, reason=reason)
            except EdgepilotError as exc:  # one stuck model must not stop the others
                log.error("model %s not unloaded on reload: %s", name, exc.message)
        self.backends.reset(new.backends.options_of, new.backends.enabled)
        self.serving.reload(new)
        for name in list(self.failed):
            if name not in after or before.get(name) != after.get(name):
                self.failed.pop(name)  # gone, or it gets another chance with its new entry
        self._update_ready()


@dataclass(frozen=True)
class ServingParts:
    """What :func:`attach` built: the registry, the request owners and the models service."""

    registry: ModelRegistry
    serving: Serving
    generator: Generator
    service: ModelsService


def register_model_commands(commands: CommandRegistry, registry: ModelRegistry) -> None:
    """``model.load|unload|list``, answered by ``registry``."""

    async def load(params: ModelName) -> dict[str, Any]:
        lm = await registry.load(params.name)
        return {"name": params.name, "loaded": True, "target": str(lm.executable.target),
                "memory_bytes": lm.memory_bytes}

    async def unload(params: ModelName) -> dict[str, Any]:
        was = await registry.unload(params.name)
        return {"name": params.name, "loaded": False, "was_loaded": was}

    async def listing(_: NoParams) -> dict[str, Any]:
        return {"models": registry.listing()}

    commands.register("model.load", ModelName, load, mutating=True,
                      summary="Load a model now (verify, estimate memory, compile)")
    commands.register("model.unload", ModelName, unload, mutating=True,
                      summary="Unload a model (it reloads on its next request)")
    commands.register("model.list", NoParams, listing,
                      summary="Models: configured and in the model dir, loaded or not")


def attach(commands: CommandRegistry, config: Config, *, live: ConfigSource,
           catalog: ModelCatalog, backends: BackendSet, devices: DeviceQueues,
           dispatcher: Dispatcher | None, work: WorkMeter, events: EventBus,
           readiness: Readiness, run_blocking: RunBlocking,
           executor: concurrent.futures.Executor) -> ServingParts:
    """Build the serving layer over the shared catalog, backends and device queues: the
    registry, the request owners for tensors (:class:`Serving`) and generation
    (:class:`Generator`), their commands and the models service. ``dispatcher`` (None: no
    per-layer planning) is built first, over the same catalog; ``live`` is the config in
    force, ``config`` the one to start with."""
    registry = ModelRegistry(config, catalog=catalog, backends=backends, devices=devices,
                             emit=events.emit, run_blocking=run_blocking, dispatcher=dispatcher)
    serving = Serving(config, registry=registry, devices=devices, work=work,
                      dispatcher=dispatcher, executor=executor)
    generator = Generator(registry=registry, devices=devices, work=work, executor=executor,
                          text=TextEncoders(serving))
    register_model_commands(commands, registry)
    register_infer(commands, serving)
    service = ModelsService(registry, serving, config=live, events=events, readiness=readiness,
                            run_blocking=run_blocking)
    return ServingParts(registry, serving, generator, service)
