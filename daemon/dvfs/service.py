"""Attach point of the DVFS capability: Board + ProfileManager, commands, start/stop service.

Start: undo a journal left by a crash, apply ``[dvfs] profile``, then watch the telemetry
sampler's temperatures with the thermal guard (edgepilot.dvfs.thermal_guard). Stop: stop the guard,
then restore.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from edgepilot.board import Board
from edgepilot.command_registry import NoParams
from edgepilot.config import Config
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.profiles import ProfileStore
from edgepilot.dvfs.thermal_guard import ThermalGuard
from edgepilot.dvfs.watch import each_sample
from edgepilot.errors import ConfigError, EdgepilotError

if TYPE_CHECKING:
    from edgepilot.lifecycle import Daemon, Service

log = logging.getLogger(__name__)


class ApplyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, description="Profile name (profile.list).")


def make_manager(config: Config, daemon: Any | None = None) -> ProfileManager:
    """The ProfileManager for this config (used by the service and by the CLI)."""
    board = daemon.board if daemon is not None and daemon.board is not None \
        else Board(config.daemon.sysfs_root)
    events = daemon.events if daemon is not None else None
    return ProfileManager(board, ProfileStore(list(config.dvfs.profile_dirs)), config.state_dir,
                          events, config.dvfs.command_timeout_s,
                          nvpmodel=config.dvfs.nvpmodel, jetson_clocks=config.dvfs.jetson_clocks)


class DvfsService:
    name = "dvfs"

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        manager: ProfileManager = daemon.profiles
        self.guard = ThermalGuard(manager, daemon.events,
                                  lambda: self.daemon.config.dvfs.thermal_dwell_s)
        manager.thermal_state = self.guard.status
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        manager: ProfileManager = self.daemon.profiles
        try:
            await self.daemon.run_blocking(manager.recover)
        except EdgepilotError as exc:
            # a device gone since the crash (an offline CPU cluster) must not keep the daemon
            # down: the rest was put back, and the journal keeps the originals for a later
            # restore (applying a profile merges into it, never loses them)
            log.error("DVFS crash recovery incomplete, journal kept (edgepilot profile restore "
                      "retries): %s", exc.message)
        name = self.daemon.config.dvfs.profile
        self._task = asyncio.create_task(self._watch(), name="dvfs-thermal-guard")
        if name:
            self.daemon.set_ready("dvfs", f"applying profile {name}")
            try:
                await self.daemon.run_blocking(manager.apply, name, "config")
            except EdgepilotError as exc:
                # the board was rolled back; serve anyway and say why in /readyz
                log.error("[dvfs] profile %s not applied: %s", name, exc.message)
                self.daemon.set_ready("dvfs", f"profile {name} not applied: {exc.message}")
                return
        self.daemon.set_ready("dvfs", None)

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            # let a check in flight finish its transaction; then no more moves
            await self._task
            self._task = None
        await self.daemon.run_blocking(self.guard.close)
        manager: ProfileManager = self.daemon.profiles
        await self.daemon.run_blocking(manager.restore, "stop")

    async def _watch(self) -> None:
        """Hand each new telemetry sample's temperatures to the guard (one sampler: theirs)."""
        def watching(running: bool) -> None:
            self.guard.watching = None if running else \
                "telemetry is not running: thermal limits are not enforced"

        def decide(sample: dict[str, Any]) -> None:
            if sample.get("temps_c"):
                self.guard.check(sample["temps_c"])

        await each_sample(self.daemon, self._stopping, decide, "thermal guard check", watching)

    async def check(self, new: Config) -> None:
        """Refuse a config naming a profile this board does not have (before anything moves)."""
        if new.dvfs.profile:
            manager: ProfileManager = self.daemon.profiles
            try:
                await self.daemon.run_blocking(manager.get, new.dvfs.profile)
            except EdgepilotError as exc:
                raise ConfigError(exc.message, field="dvfs.profile") from None

    async def reload(self, old: Config, new: Config) -> None:
        manager: ProfileManager = self.daemon.profiles
        if (old.dvfs.nvpmodel, old.dvfs.jetson_clocks) != (new.dvfs.nvpmodel,
                                                           new.dvfs.jetson_clocks):
            await self.daemon.run_blocking(manager.set_tools, new.dvfs.nvpmodel,
                                           new.dvfs.jetson_clocks)
        if old.dvfs.profile == new.dvfs.profile:
            return
        if new.dvfs.profile:
            await self.daemon.run_blocking(manager.apply, new.dvfs.profile, "config")
        else:
            await self.daemon.run_blocking(manager.restore, "config")


async def _apply(daemon: Daemon, params: ApplyParams) -> dict[str, Any]:
    result: dict[str, Any] = await daemon.run_blocking(daemon.profiles.apply, params.name)
    return result


async def _restore(daemon: Daemon, _: NoParams) -> dict[str, Any]:
    result: dict[str, Any] = await daemon.run_blocking(daemon.profiles.restore, "command")
    return result


async def _list(daemon: Daemon, _: NoParams) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = await daemon.run_blocking(daemon.profiles.list)
    return result


async def _get(daemon: Daemon, _: NoParams) -> dict[str, Any]:
    result: dict[str, Any] = await daemon.run_blocking(daemon.profiles.status)
    return result


def register_commands(daemon: Daemon) -> None:
    reg = daemon.commands.register
    reg("profile.apply", ApplyParams, _apply, mutating=True,
        summary="Apply a DVFS profile (transactional)")
    reg("profile.restore", NoParams, _restore, mutating=True,
        summary="Restore the clocks edgepilot changed")
    reg("profile.list", NoParams, _list, summary="DVFS profiles for this board")
    reg("profile.get", NoParams, _get, summary="Active DVFS profile and current clocks")


def attach(daemon: Daemon) -> list[Service]:
    daemon.board = Board(daemon.config.daemon.sysfs_root)
    daemon.profiles = make_manager(daemon.config, daemon)
    register_commands(daemon)
    return [DvfsService(daemon)]
