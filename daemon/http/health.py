"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from edgepilot.http.api import api_of

router = APIRouter()


@router.get("/healthz", summary="The event loop is alive")
async def healthz(request: Request) -> dict[str, object]:
    return {"status": "ok", "uptime_s": round(time.time() - api_of(request).started_at, 3)}


@router.get("/readyz", summary="Models and backends are ready (503 with reasons until then)")
async def readyz(request: Request) -> JSONResponse:
    api = api_of(request)
    reasons = api.readiness.reasons()
    if api.readiness.stopping:
        reasons["daemon"] = "stopping"
    # each backend target's tiny probe, run once at start (PASS / FAIL / SKIP)
    targets = dict(api.serving.targets) if api.serving is not None else {}
    if reasons:
        return JSONResponse({"status": "not ready", "reasons": reasons, "targets": targets},
                            status_code=503)
    return JSONResponse({"status": "ready", "targets": targets})


@router.get("/metrics", summary="Prometheus metrics, text format")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(api_of(request).metrics), media_type=CONTENT_TYPE_LATEST)
