"""The energy policies on top of DVFS: the SLO pick and the power cap.

Built before the DVFS service (whose thermal guard asks the SLO picker for a cooler profile
that still meets the SLO), started after telemetry and MQTT (it reads the sampler's samples;
its events should reach the broker) and so stopped before them and before the DVFS service,
whose stop restores every write both policies made. Start: validate ``[dvfs] slo_model``,
start the SLO pick in the background (``/readyz`` says "measuring" meanwhile; the power cap
holds still while profiles are measured), then hand every new telemetry sample's power to the
power cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from edgepilot.blocking import RunBlocking
from edgepilot.config import Config, ConfigSource
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.powercap import PowerCap
from edgepilot.dvfs.slo import SloPicker, check_model
from edgepilot.dvfs.watch import each_sample
from edgepilot.errors import EdgepilotError
from edgepilot.events import EventBus
from edgepilot.readiness import Readiness
from edgepilot.telemetry.sampler import TelemetrySampler

log = logging.getLogger(__name__)
MEASURING = "measuring DVFS profiles for the SLO pick"


class EnergyService:
    """Runs the SLO pick and the power cap loop for one daemon."""

    name = "energy"

    def __init__(self, manager: ProfileManager, *, config: ConfigSource, events: EventBus,
                 readiness: Readiness, run_blocking: RunBlocking, dispatcher: Dispatcher,
                 sampler: TelemetrySampler | None,
                 hold_devices: Callable[[], AbstractContextManager[Any]]) -> None:
        self.manager = manager
        self.config = config
        self.events = events
        self.readiness = readiness
        self.run_blocking = run_blocking
        self.dispatcher = dispatcher
        self.sampler = sampler
        dvfs = lambda: config().dvfs  # noqa: E731 - re-read: SIGHUP may change it
        self.cap = PowerCap(manager, events, lambda: dvfs().power_cap_w,
                            lambda: dvfs().power_cap_hysteresis_w)
        self.slo = SloPicker(manager, config=config, events=events, dispatcher=dispatcher,
                             hold_devices=hold_devices)
        manager.add_reporter("power_cap", self.cap.status)
        manager.add_reporter("slo", self.slo.status)
        if sampler is not None:
            sampler.add_extra(self._telemetry)
        self._stopping = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        self._slo_task: asyncio.Task[None] | None = None

    def _telemetry(self) -> dict[str, Any]:
        """``power_cap`` in every telemetry report and snapshot (when a cap is configured or
        still in force)."""
        if self.config().dvfs.power_cap_w is None and not self.cap.steps:
            return {}
        return {"power_cap": self.cap.status()}

    async def start(self) -> None:
        if self.config().dvfs.slo_ms is not None:
            # an unknown or GGUF slo_model stops the start, naming the key and the models
            await self.run_blocking(check_model, self.dispatcher, self.config())
            self._start_slo()
        self._watch_task = asyncio.create_task(self._watch(), name="power-cap")

    def _start_slo(self) -> None:
        if self._slo_task is not None and not self._slo_task.done():
            return  # the pick under way reads the config as it is now when it picks
        self.cap.paused = MEASURING
        model = self.config().dvfs.slo_model
        self.readiness.set("slo", f"measuring DVFS profiles for [dvfs] slo_model {model}")
        self._slo_task = asyncio.create_task(self._pick(), name="slo-pick")

    async def _pick(self) -> None:
        try:
            await self.run_blocking(self.slo.pick_and_apply)
            self.readiness.set("slo", None)
        except RuntimeError as exc:  # the executor is shut down with the daemon
            log.debug("SLO pick stopped: %s", exc)
        except EdgepilotError as exc:
            if not self._stopping.is_set():
                log.error("[dvfs] slo_ms: no profile picked: %s", exc.message)
                self.slo.fail(exc.message)
                self.readiness.set("slo", f"SLO pick failed: {exc.message}")
                self.events.emit("slo.failed", message=exc.message, field=exc.field)
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
        await self.run_blocking(self.cap.close)

    async def _watch(self) -> None:
        """Hand each new telemetry sample's board power to the power cap."""
        def decide(sample: dict[str, Any]) -> None:
            if self.config().dvfs.power_cap_w is not None or self.cap.steps \
                    or self.manager.caps.caps:
                self.cap.check(sample.get("power_w"))

        await each_sample(self.sampler, lambda: self.config().telemetry.sample_interval_s,
                          self.run_blocking, self._stopping, decide, "power cap check")

    async def check(self, new: Config) -> None:
        """Refuse a reload naming an unknown or non-tensor slo_model."""
        if new.dvfs.slo_model is not None:
            await self.run_blocking(check_model, self.dispatcher, new)

    async def reload(self, old: Config, new: Config) -> None:
        """A changed SLO is picked again; a changed cap acts on the next sample."""
        if (old.dvfs.slo_ms, old.dvfs.slo_model) == (new.dvfs.slo_ms, new.dvfs.slo_model):
            return
        if new.dvfs.slo_ms is not None:
            self._start_slo()
        else:
            self.slo.forget()
            self.readiness.set("slo", None)
            if new.dvfs.profile is None:  # else the DVFS service just applied that one
                await self.run_blocking(self.manager.restore, "config")
