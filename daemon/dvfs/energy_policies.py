"""Attach point of the energy policies on top of DVFS: the SLO pick and the power cap.

Attached after telemetry and MQTT (it reads the sampler's samples; its events should reach the
broker) and so stopped before them and before the DVFS service, whose stop restores every
write both policies made. Start: validate ``[dvfs] slo_model``, start the SLO pick in the
background (``/readyz`` says "measuring" meanwhile; the power cap holds still while profiles
are measured), then hand every new telemetry sample's power to the power cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from edgepilot.config import Config
from edgepilot.dvfs.powercap import PowerCap
from edgepilot.dvfs.slo import SloPicker, check_model
from edgepilot.dvfs.watch import each_sample
from edgepilot.errors import EdgepilotError

if TYPE_CHECKING:
    from edgepilot.lifecycle import Daemon, Service

log = logging.getLogger(__name__)
MEASURING = "measuring DVFS profiles for the SLO pick"


class EnergyService:
    """Runs the SLO pick and the power cap loop for one daemon."""

    name = "energy"

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        manager = daemon.profiles
        dvfs = lambda: daemon.config.dvfs  # noqa: E731 - re-read: SIGHUP may change it
        self.cap = PowerCap(manager, daemon.events, lambda: dvfs().power_cap_w,
                            lambda: dvfs().power_cap_hysteresis_w)
        self.slo = SloPicker(daemon)
        manager.reporters["power_cap"] = self.cap.status
        manager.reporters["slo"] = self.slo.status
        manager.fallback_chooser = self.slo.choose_fallback
        if daemon.telemetry is not None:
            daemon.telemetry.add_extra(self._telemetry)
        self._stopping = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        self._slo_task: asyncio.Task[None] | None = None

    def _telemetry(self) -> dict[str, Any]:
        """``power_cap`` in every telemetry report and snapshot (when a cap is configured or
        still in force)."""
        if self.daemon.config.dvfs.power_cap_w is None and not self.cap.steps:
            return {}
        return {"power_cap": self.cap.status()}

    async def start(self) -> None:
        if self.daemon.config.dvfs.slo_ms is not None:
            # an unknown or GGUF slo_model stops the start, naming the key and the models
            await self.daemon.run_blocking(check_model, self.daemon, self.daemon.config)
            self._start_slo()
        self._watch_task = asyncio.create_task(self._watch(), name="power-cap")

    def _start_slo(self) -> None:
        if self._slo_task is not None and not self._slo_task.done():
            return  # the pick under way reads the config as it is now when it picks
        self.cap.paused = MEASURING
        model = self.daemon.config.dvfs.slo_model
        self.daemon.set_ready("slo", f"measuring DVFS profiles for [dvfs] slo_model {model}")
        self._slo_task = asyncio.create_task(self._pick(), name="slo-pick")

    async def _pick(self) -> None:
        try:
            await self.daemon.run_blocking(self.slo.pick_and_apply)
            self.daemon.set_ready("slo", None)
        except RuntimeError as exc:  # the executor is shut down with the daemon
            log.debug("SLO pick stopped: %s", exc)
        except EdgepilotError as exc:
            if not self._stopping.is_set():
                log.error("[dvfs] slo_ms: no profile picked: %s", exc.message)
                self.slo.fail(exc.message)
                self.daemon.set_ready("slo", f"SLO pick failed: {exc.message}")
                self.daemon.events.emit("slo.failed", message=exc.message, field=exc.field)
        finally:
            self.cap.paused = None

    async def stop(self) -> None:
        self._stopping.set()
        self.slo.cancel()
        for task in (self._slo_task, self._watch_task):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._slo_task = self._watch_task = None
        await self.daemon.run_blocking(self.cap.close)

    async def _watch(self) -> None:
        """Hand each new telemetry sample's board power to the power cap."""
        def decide(sample: dict[str, Any]) -> None:
            if self.daemon.config.dvfs.power_cap_w is not None or self.cap.steps \
                    or self.daemon.profiles.caps.caps:
                self.cap.check(sample.get("power_w"))

        await each_sample(self.daemon, self._stopping, decide, "power cap check")

    async def check(self, new: Config) -> None:
        """Refuse a reload naming an unknown or non-tensor slo_model."""
        if new.dvfs.slo_model is not None:
            await self.daemon.run_blocking(check_model, self.daemon, new)

    async def reload(self, old: Config, new: Config) -> None:
        """A changed SLO is picked again; a changed cap acts on the next sample."""
        if (old.dvfs.slo_ms, old.dvfs.slo_model) == (new.dvfs.slo_ms, new.dvfs.slo_model):
            return
        if new.dvfs.slo_ms is not None:
            self._start_slo()
        else:
            self.slo.forget()
            self.daemon.set_ready("slo", None)
            if new.dvfs.profile is None:  # else the DVFS service just applied that one
                await self.daemon.run_blocking(self.daemon.profiles.restore, "config")


def attach(daemon: Daemon) -> list[Service]:
    return [EnergyService(daemon)]
