"""``GET /v1/plan/{model}``: the model's per-layer plan; ``POST .../replan`` replans it.

Making a plan takes seconds (a minute for a big model; the first plan on a board also times
the kernel corpus), so ``GET`` never waits for one unless asked to (``?wait=true``): while the
plan is being made in the background it answers ``202`` with how far it got, and ``200`` with
the plan once it exists.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.errors import PlanError
from edgepilot.http.api import api_of
from edgepilot.http.auth import require_token

router = APIRouter(tags=["plan"])

# seconds a client should wait before asking again while a plan is being made
RETRY_AFTER_S = 1


class PlanningOff(PlanError):
    """Per-layer planning is switched off in this daemon: a state of its config, not a fault."""

    code = "planning_off"
    http_status = 409


def _dispatcher(request: Request) -> Dispatcher:
    dispatcher = api_of(request).dispatcher
    if dispatcher is None:
        raise PlanningOff("per-layer planning is not available in this daemon (no dispatcher "
                          "attached); models run whole on their default target", field="model")
    return dispatcher


@router.get("/v1/plan")
async def list_plans(request: Request) -> dict[str, Any]:
    """The plans in hand, per model and input shapes: hash and targets per segment; the plans
    being made and the ones that failed. Never starts planning (``edgepilot top`` reads it)."""
    result: dict[str, Any] = _dispatcher(request).summaries()
    return result


# it can start seconds to minutes of profiling on the board: a token when one is set, like the
# mutating routes
@router.get("/v1/plan/{model}", dependencies=[Depends(require_token)], responses={202: {
    "description": "The plan is being made in the background: "
                   '{"state": "planning", "model", "signature", "done", "total", "what"}; '
                   "ask again (Retry-After) for the plan"}})
async def get_plan(model: str, request: Request, wait: bool = False) -> Any:
    """Per layer: target, predicted and measured ms, runner-up; plan totals and hash.

    Without a plan yet: 202 with the planning progress (planning starts in the background on
    the first ask); ``wait=true`` waits for the plan instead.
    """
    dispatcher = _dispatcher(request)
    if not wait:
        progress = dispatcher.plan_progress(model)
        if progress is not None:
            return JSONResponse(progress, status_code=202,
                                headers={"Retry-After": str(RETRY_AFTER_S)})
    result: dict[str, Any] = await dispatcher.plan(model)
    return result


@router.post("/v1/plan/{model}/replan", dependencies=[Depends(require_token)])
async def replan(model: str, request: Request, reprofile: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = await _dispatcher(request).replan(model, reprofile)
    return result
