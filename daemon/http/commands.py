"""``POST /v1/commands/{verb}``: every registered command over HTTP, same replies as MQTT."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from edgepilot.command_registry import reply_for
from edgepilot.http.api import api_of
from edgepilot.http.auth import require_token
from edgepilot.http.bodies import parse_json
from edgepilot.serving.offload import off_loop

router = APIRouter()


@router.get("/v1/commands", summary="Registered command verbs")
async def list_commands(request: Request) -> dict[str, Any]:
    reg = api_of(request).commands
    return {"verbs": [{"verb": v, "mutating": reg.get(v).mutating, "summary": reg.get(v).summary}
                      for v in reg.verbs()]}


# the body is read and parsed here (off the loop), so FastAPI does not document it by itself
COMMAND_OPENAPI = {"requestBody": {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "description": "the verb's params (GET /v1/commands lists the verbs); "
    "an empty body is {}"}}}}}


@router.post("/v1/commands/{verb}", summary="Run a command (the MQTT cmd/<verb> equivalent)",
             openapi_extra=COMMAND_OPENAPI)
async def run_command(verb: str, request: Request) -> dict[str, Any]:
    commands = api_of(request).commands
    raw = await request.body()
    payload = await off_loop(parse_json, raw, {})
    cmd = commands.get(verb)
    if cmd.mutating:
        require_token(request)
    return reply_for(await commands.execute(verb, payload))
