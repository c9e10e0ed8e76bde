"""Attach point of telemetry: the sampler service, the ``telemetry.get`` command, metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgepilot.command_registry import NoParams
from edgepilot.telemetry.metrics import TelemetryCollector
from edgepilot.telemetry.sampler import TelemetrySampler

if TYPE_CHECKING:
    from edgepilot.lifecycle import Daemon, Service


async def _telemetry_get(daemon: Daemon, _: NoParams) -> dict[str, Any]:
    sampler: TelemetrySampler = daemon.telemetry
    return sampler.snapshot()


def attach(daemon: Daemon) -> list[Service]:
    """Create the sampler (``daemon.telemetry``), register ``telemetry.get`` and the metrics."""
    sampler = TelemetrySampler(daemon)
    daemon.telemetry = sampler
    daemon.set_ready("telemetry", "first sample not taken yet")
    daemon.commands.register("telemetry.get", NoParams, _telemetry_get,
                             summary="Latest telemetry sample with per-model work")
    daemon.metrics.register(TelemetryCollector(sampler))
    return [sampler]
