"""The FastAPI application: routers from each capability, one error shape, body limits."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from edgepilot import __version__
from edgepilot.commands import error_body
from edgepilot.errors import EdgepilotError
from edgepilot.http import (
    commands,
    config,
    health,
    infer,
    openai,
    plan,
    profile,
    telemetry,
)

if TYPE_CHECKING:
    from edgepilot.lifecycle import Daemon

log = logging.getLogger(__name__)



def http_error(status: int, body: dict[str, Any]) -> JSONResponse:
    """Error shape shared with MQTT ({code, message, field}) plus OpenAI's {type, param}."""
    err = dict(body)
    err.setdefault("type", "invalid_request_error" if status < 500 else "server_error")
    err.setdefault("param", err.get("field"))
    return JSONResponse({"error": err}, status_code=status)


class BodyLimit:
    """Refuse bodies over ``limit`` bytes before they are read into memory (413)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        resp = http_error(413, {"code": "payload_too_large", "field": "body",
                                "message": f"request body over the {self.limit}-byte limit "
                                           "([http] max_body_bytes)"})
        await resp(scope, receive, send)


class _TooLarge(Exception):
    pass


def create_app(daemon: Daemon) -> FastAPI:
    app = FastAPI(title="edgepilot", version=__version__,
                  description="Local API of the edgepilot daemon.")
    app.state.daemon = daemon

    @app.exception_handler(EdgepilotError)
    async def _edgepilot_error(_: Request, exc: EdgepilotError) -> JSONResponse:
        return http_error(exc.http_status, error_body(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            # its loc is ("body", <char offset>): the offset is no field
            where = first.get("loc", ())[-1:]
            ctx = first.get("ctx")
            why = ctx.get("error", "") if isinstance(ctx, dict) else ""
            return http_error(422, {"code": "bad_request", "field": "body",
                                    "message": f"request body is not valid JSON ({why} at "
                                               f"character {where[0] if where else '?'})"})
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        field = ".".join(loc) or None
        if field is None:
            # the body as a whole was not a JSON object (often: curl -d without a JSON
            # Content-Type, which FastAPI then does not parse as JSON)
            return http_error(422, {"code": "bad_request", "field": "body",
                                    "message": "request body must be a JSON object sent with "
                                               f"'Content-Type: application/json' "
                                               f"({first.get('msg')})"})
        return http_error(422, {"code": "bad_request", "field": field,
                                "message": f"field '{field}': {first.get('msg')}"})

    for module in (health, commands, profile, telemetry, config, openai, infer, plan):
        app.include_router(module.router)
    app.add_middleware(BodyLimit, limit=daemon.config.http.max_body_bytes)
    return app
