"""Attach the dispatcher: commands ``plan.get``/``plan.replan``, and replans on
``profile.applied``, ``thermal``, ``power_cap.step`` and ``backend.fault`` events.

One clock move, one replan: the DVFS thermal guard moves profiles through the manager, which
emits ``profile.applied`` (reason "thermal"), and then reports the same move as a ``thermal``
event whose ``action`` is "fallback" or "return". The profile event already replans, so those
``thermal`` events are ignored. Any other ``thermal`` event (the sampler's warning crossing, the
guard's "none"/"..._failed") changed no profile: it replans only the models whose clocks moved
since they were planned (the kernel throttling a hot zone), so it never doubles a move either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from edgepilot.blocking import RunBlocking
from edgepilot.command_registry import CommandRegistry
from edgepilot.config import Config
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.model_dispatch import ModelDispatch
from edgepilot.events import EventBus
from edgepilot.readiness import Readiness

log = logging.getLogger(__name__)

# a power-cap step moves max clocks like a profile does: plans are re-predicted at once rather
# than when drift notices
CLOCK_EVENTS = ("profile.applied", "profile.restored", "thermal", "power_cap.step")
# thermal actions that went through ProfileManager.apply, i.e. came with a profile.applied
PROFILE_MOVES = ("fallback", "return")


class PlanParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=256, description="Model name (or file stem).")


class ReplanParams(PlanParams):
    reprofile: bool = Field(False, description="Measure the board again before planning.")


class DispatchService:
    """Wires events to replans; holds no threads of its own."""

    name = "dispatch"

    def __init__(self, dispatcher: Dispatcher, *, events: EventBus, readiness: Readiness,
                 run_blocking: RunBlocking, close_devices: Callable[[], None]) -> None:
        """``close_devices``: on stop, a measurement waiting for the devices gives up."""
        self.dispatcher = dispatcher
        self.events = events
        self.readiness = readiness
        self.run_blocking = run_blocking
        self.close_devices = close_devices
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        # events arrive on whichever thread emitted them; replans are scheduled on this loop
        self._loop = asyncio.get_running_loop()
        self.events.subscribe(self._on_event)
        self.readiness.set("dispatch", None)

    async def stop(self) -> None:
        self.events.unsubscribe(self._on_event)
        self.dispatcher.cancelled = True
        for md in self.dispatcher.prepared():
            if isinstance(md, ModelDispatch):
                md.recovery.close()  # no probe starts while the daemon stops
        # a measurement waiting for the devices gives up now rather than at its timeout
        self.close_devices()
        for task in list(self._tasks):
            task.cancel()

    async def idle(self) -> None:
        """Wait until the replans scheduled so far have finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def reload(self, old: Config, new: Config) -> None:
        self.dispatcher.reload(new)

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "thermal" and event.get("action") in PROFILE_MOVES:
            return  # its profile.applied (reason "thermal") already replanned
        if kind in CLOCK_EVENTS:
            self._schedule(self._clocks(str(kind), only_if_moved=kind in ("thermal",
                                                                          "power_cap.step")))
        elif kind == "backend.fault" and "plan" not in event and event.get("target"):
            # a fault reported by someone else (a backend at load); ours carry "plan"
            self._schedule(self._fault(str(event["target"])))

    def _schedule(self, coro: Coroutine[Any, Any, None]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            return

        def spawn() -> None:
            task = asyncio.ensure_future(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        loop.call_soon_threadsafe(spawn)

    async def _clocks(self, reason: str, only_if_moved: bool) -> None:
        await self.run_blocking(self.dispatcher.clocks_changed, reason, only_if_moved)

    async def _fault(self, target: str) -> None:
        def work() -> None:
            for md in self.dispatcher.prepared():
                if md.builder is not None and md.plan is not None and target in md.plan.targets:
                    md.builder.excluded.add(target)
                    md.replan(f"fault:{target}", force=True)

        await self.run_blocking(work)


def attach(commands: CommandRegistry, dispatcher: Dispatcher, *, events: EventBus,
           readiness: Readiness, run_blocking: RunBlocking,
           close_devices: Callable[[], None]) -> DispatchService:
    """Register ``plan.get`` and ``plan.replan`` on ``dispatcher``; returns the service that
    replans it on clock moves and faults."""

    async def plan_get(params: PlanParams) -> dict[str, Any]:
        return await dispatcher.plan(params.model)

    async def plan_replan(params: ReplanParams) -> dict[str, Any]:
        return await dispatcher.replan(params.model, params.reprofile)

    # it can start seconds of profiling: guarded like a mutating verb (the token over HTTP)
    commands.register("plan.get", PlanParams, plan_get, mutating=True,
                      summary="Per-layer plan of a model (plans it on first use)")
    commands.register("plan.replan", ReplanParams, plan_replan, mutating=True,
                      summary="Replan a model now (optionally re-measuring the board)")
    return DispatchService(dispatcher, events=events, readiness=readiness,
                           run_blocking=run_blocking, close_devices=close_devices)
