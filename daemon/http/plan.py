"""``GET /v1/plan/{model}``: the model's per-layer plan; ``POST .../replan`` replans it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from edgepilot.errors import PlanError
from edgepilot.http.auth import require_token

router = APIRouter(tags=["plan"])


def _dispatcher(request: Request) -> Any:
    dispatcher = request.app.state.daemon.dispatcher
    if dispatcher is None:
        raise PlanError("the dispatcher is not attached in this daemon", field="model")
    return dispatcher


@router.get("/v1/plan/{model}")
async def get_plan(model: str, request: Request) -> dict[str, Any]:
    """Per layer: target, predicted and measured ms, runner-up; plan totals and hash."""
    result: dict[str, Any] = await _dispatcher(request).plan(model)
    return result


@router.post("/v1/plan/{model}/replan", dependencies=[Depends(require_token)])
async def replan(model: str, request: Request, reprofile: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = await _dispatcher(request).replan(model, reprofile)
    return result
