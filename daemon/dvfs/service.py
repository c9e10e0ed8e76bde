"""Attach point of the DVFS capability: the ProfileManager's commands and its start/stop service.

Start: undo a journal left by a crash, apply ``[dvfs] profile``, then watch the telemetry
sampler's temperatures with the thermal guard (edgepilot.dvfs.thermal_guard). Stop: stop the guard,
then restore.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from edgepilot.blocking import RunBlocking
from edgepilot.board import Board
from edgepilot.command_registry import CommandRegistry, NoParams
from edgepilot.config import Config, ConfigSource
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.profiles import ProfileStore
from edgepilot.dvfs.thermal_guard import FallbackChooser, ThermalGuard
from edgepilot.dvfs.watch import each_sample
from edgepilot.errors import ConfigError, EdgepilotError
from edgepilot.events import EventBus
from edgepilot.readiness import Readiness
from edgepilot.telemetry.sampler import TelemetrySampler

log = logging.getLogger(__name__)


class ApplyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, description="Profile name (profile.list).")


def make_manager(config: Config, board: Board | None = None,
                 events: EventBus | None = None) -> ProfileManager:
    """The ProfileManager for this config (the daemon's, with its board and event bus, and
    the CLI's)."""
    return ProfileManager(board or Board(config.daemon.sysfs_root),
                          ProfileStore(list(config.dvfs.profile_dirs)), config.state_dir,
                          events, config.dvfs.command_timeout_s,
                          nvpmodel=config.dvfs.nvpmodel, jetson_clocks=config.dvfs.jetson_clocks)


class DvfsService:
    name = "dvfs"

    def __init__(self, manager: ProfileManager, *, config: ConfigSource, events: EventBus,
                 readiness: Readiness, run_blocking: RunBlocking,
                 sampler: TelemetrySampler | None,
                 choose_fallback: FallbackChooser | None = None) -> None:
        self.manager = manager
        self.config = config
        self.readiness = readiness
        self.run_blocking = run_blocking
        self.sampler = sampler
        self.guard = ThermalGuard(manager, events, lambda: self.config().dvfs.thermal_dwell_s,
                                  choose_fallback=choose_fallback)
        manager.add_reporter("thermal", self.guard.status)
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        manager = self.manager
        try:
            await self.run_blocking(manager.recover)
        except EdgepilotError as exc:
            # a device gone since the crash (an offline CPU cluster) must not keep the daemon
            # down: the rest was put back, and the journal keeps the originals for a later
            # restore (applying a profile merges into it, never loses them)
            log.error("DVFS crash recovery incomplete, journal kept (edgepilot profile restore "
                      "retries): %s", exc.message)
        name = self.config().dvfs.profile
        self._task = asyncio.create_task(self._watch(), name="dvfs-thermal-guard")
        if name:
            self.readiness.set("dvfs", f"applying profile {name}")
            try:
                await self.run_blocking(manager.apply, name, "config")
            except EdgepilotError as exc:
                # the board was rolled back; serve anyway and say why in /readyz
                log.error("[dvfs] profile %s not applied: %s", name, exc.message)
                self.readiness.set("dvfs", f"profile {name} not applied: {exc.message}")
                return
        self.readiness.set("dvfs", None)

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            # let a check in flight finish its transaction; then no more moves
            await self._task
            self._task = None
        await self.run_blocking(self.guard.close)
        await self.run_blocking(self.manager.restore, "stop")

    async def _watch(self) -> None:
        """Hand each new telemetry sample's temperatures to the guard (one sampler: theirs)."""
        def watching(running: bool) -> None:
            self.guard.watching = None if running else \
                "telemetry is not running: thermal limits are not enforced"

        def decide(sample: dict[str, Any]) -> None:
            if sample.get("temps_c"):
                self.guard.check(sample["temps_c"])

        await each_sample(self.sampler, lambda: self.config().telemetry.sample_interval_s,
                          self.run_blocking, self._stopping, decide, "thermal guard check",
                          watching)

    async def check(self, new: Config) -> None:
        """Refuse a config naming a profile this board does not have (before anything moves)."""
        if new.dvfs.profile:
            try:
                await self.run_blocking(self.manager.get, new.dvfs.profile)
            except EdgepilotError as exc:
                raise ConfigError(exc.message, field="dvfs.profile") from None

    async def reload(self, old: Config, new: Config) -> None:
        manager = self.manager
        if (old.dvfs.nvpmodel, old.dvfs.jetson_clocks) != (new.dvfs.nvpmodel,
                                                           new.dvfs.jetson_clocks):
            await self.run_blocking(manager.set_tools, new.dvfs.nvpmodel,
                                    new.dvfs.jetson_clocks)
        if old.dvfs.profile == new.dvfs.profile:
            return
        if new.dvfs.profile:
            await self.run_blocking(manager.apply, new.dvfs.profile, "config")
        else:
            await self.run_blocking(manager.restore, "config")


def register_commands(commands: CommandRegistry, manager: ProfileManager,
                      run_blocking: RunBlocking) -> None:
    """``profile.apply|restore|list|get``, answered by ``manager`` off the loop."""

    async def apply(params: ApplyParams) -> dict[str, Any]:
        return await run_blocking(manager.apply, params.name)

    async def restore(_: NoParams) -> dict[str, Any]:
        return await run_blocking(manager.restore, "command")

    async def listing(_: NoParams) -> list[dict[str, Any]]:
        return await run_blocking(manager.list)

    async def get(_: NoParams) -> dict[str, Any]:
        return await run_blocking(manager.status)

    reg = commands.register
    reg("profile.apply", ApplyParams, apply, mutating=True,
        summary="Apply a DVFS profile (transactional)")
    reg("profile.restore", NoParams, restore, mutating=True,
        summary="Restore the clocks edgepilot changed")
    reg("profile.list", NoParams, listing, summary="DVFS profiles for this board")
    reg("profile.get", NoParams, get, summary="Active DVFS profile and current clocks")


def attach(commands: CommandRegistry, manager: ProfileManager, *, config: ConfigSource,
           events: EventBus, readiness: Readiness, run_blocking: RunBlocking,
           sampler: TelemetrySampler | None,
           choose_fallback: FallbackChooser | None = None) -> DvfsService:
    """Register the profile commands on ``manager``; returns the service that recovers,
    applies ``[dvfs] profile``, guards the thermal limits and restores on stop."""
    register_commands(commands, manager, run_blocking)
    return DvfsService(manager, config=config, events=events, readiness=readiness,
                       run_blocking=run_blocking, sampler=sampler,
                       choose_fallback=choose_fallback)
