"""``GET /v1/telemetry``: the latest telemetry sample as JSON."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from edgepilot.errors import NotFoundError

router = APIRouter()


@router.get("/v1/telemetry", summary="Latest telemetry sample (power, energy, clocks, work)")
async def get_telemetry(request: Request) -> dict[str, Any]:
    sampler = request.app.state.daemon.telemetry
    if sampler is None:
        raise NotFoundError("telemetry is not running in this daemon", field=None)
    snapshot: dict[str, Any] = sampler.snapshot()
    return snapshot
