"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter()


@router.get("/healthz", summary="The event loop is alive")
async def healthz(request: Request) -> dict[str, object]:
    daemon = request.app.state.daemon
    return {"status": "ok", "uptime_s": round(time.time() - daemon.started_at, 3)}


@router.get("/readyz", summary="Models and backends are ready (503 with reasons until then)")
async def readyz(request: Request) -> JSONResponse:
    daemon = request.app.state.daemon
    reasons = daemon.not_ready_reasons()
    if daemon.stopping:
        reasons["daemon"] = "stopping"
    # each backend target's tiny probe, run once at start (PASS / FAIL / SKIP)
    targets = dict(daemon.serving.targets)
    if reasons:
        return JSONResponse({"status": "not ready", "reasons": reasons, "targets": targets},
                            status_code=503)
    return JSONResponse({"status": "ready", "targets": targets})


@router.get("/metrics", summary="Prometheus metrics, text format")
async def metrics(request: Request) -> Response:
    registry = request.app.state.daemon.metrics
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
