"""Attach point of telemetry: the sampler service, the ``telemetry.get`` command, metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from edgepilot.blocking import RunBlocking
from edgepilot.board.board import Board
from edgepilot.command_registry import CommandRegistry, NoParams
from edgepilot.config import ConfigSource
from edgepilot.events import EventBus
from edgepilot.readiness import Readiness
from edgepilot.telemetry.metrics import TelemetryCollector
from edgepilot.telemetry.power_history import PowerHistory
from edgepilot.telemetry.sampler import ActiveProfile, TelemetrySampler
from edgepilot.telemetry.work import WorkMeter


def attach(commands: CommandRegistry, metrics: CollectorRegistry, *, config: ConfigSource,
           board: Board | None, profiles: ActiveProfile | None, work: WorkMeter,
           power: PowerHistory, events: EventBus, readiness: Readiness,
           run_blocking: RunBlocking, state_dir: Path) -> TelemetrySampler:
    """Build the sampler (a service: it samples from start to stop), register
    ``telemetry.get`` and its Prometheus collector."""
    sampler = TelemetrySampler(config=config, board=board, profiles=profiles, work=work,
                               power=power, events=events, readiness=readiness,
                               run_blocking=run_blocking, state_dir=state_dir)

    async def telemetry_get(_: NoParams) -> dict[str, Any]:
        return sampler.snapshot()

    readiness.set("telemetry", "first sample not taken yet")
    commands.register("telemetry.get", NoParams, telemetry_get,
                      summary="Latest telemetry sample with per-model work")
    metrics.register(TelemetryCollector(sampler))
    return sampler
