"""``GET /v1/telemetry``: the latest telemetry sample as JSON."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from edgepilot.errors import NotFoundError
from edgepilot.http.api import api_of

router = APIRouter()


@router.get("/v1/telemetry", summary="Latest telemetry sample (power, energy, clocks, work)")
async def get_telemetry(request: Request) -> dict[str, Any]:
    sampler = api_of(request).telemetry
    if sampler is None:
        raise NotFoundError("telemetry is not running in this daemon", field=None)
    snapshot: dict[str, Any] = sampler.snapshot()
    return snapshot
