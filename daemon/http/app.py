"""The FastAPI application: routers from each capability, one error shape, body limits."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from edgepilot import __version__
from edgepilot.command_registry import error_body
from edgepilot.errors import EdgepilotError
from edgepilot.http import (
    commands,
    config,
    health,
    infer,
    ollama,
    openai,
    plan,
    profile,
    responses,
    telemetry,
)
from edgepilot.http.api import HttpApi
from edgepilot.http.bodies import field_of
from edgepilot.http.cors import LlmCors
from edgepilot.http.ollama_run import ollama_error
from edgepilot.json_depth import MAX_DEPTH, too_deep

log = logging.getLogger(__name__)

# the ``code`` of an error Starlette/FastAPI raise themselves (no route, wrong method, a body
# their parser could not read), by HTTP status
_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 413: "payload_too_large",
               415: "unsupported_media_type", 422: "bad_request"}


def http_error(status: int, body: dict[str, Any],
               headers: dict[str, str] | None = None, path: str = "") -> JSONResponse:
    """Error shape shared with MQTT ({code, message, field}) plus OpenAI's {type, param}; on
    Ollama's routes (``/api/*``) ``error`` is the message as a string, as Ollama's clients
    read it (:func:`~edgepilot.http.ollama_run.ollama_error`)."""
    if path.startswith("/api/"):
        return JSONResponse(ollama_error(body), status_code=status, headers=headers)
    err = dict(body)
    err.setdefault("type", "invalid_request_error" if status < 500 else "server_error")
    err.setdefault("param", err.get("field"))
    return JSONResponse({"error": err}, status_code=status, headers=headers)


def _starlette_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """A 404/405/400... raised by the framework itself, in the one error shape."""
    status = exc.status_code
    code = _HTTP_CODES.get(status, "internal" if status >= 500 else "bad_request")
    field: str | None = None
    if status == 404 and exc.detail in (None, "Not Found"):
        message = (f"no route {request.method} {request.url.path}; /openapi.json lists the "
                   "routes")
        field = "path"
    elif status == 405:
        allowed = (exc.headers or {}).get("Allow") or (exc.headers or {}).get("allow")
        message = (f"{request.method} is not allowed on {request.url.path}"
                   + (f" (allowed: {allowed})" if allowed else ""))
        field = "method"
    elif status == 400 and exc.detail == "There was an error parsing the body":
        # FastAPI's parser failed on something other than JSON syntax (e.g. bytes that are
        # not UTF-8)
        message = "request body could not be read as JSON (is it UTF-8 encoded JSON?)"
        field = "body"
    elif status == 413 or isinstance(exc, _TooDeep):
        message, field = str(exc.detail), "body"
    else:
        message = str(exc.detail)
    return http_error(status, {"code": code, "message": message, "field": field},
                      headers=dict(exc.headers) if exc.headers else None,
                      path=request.url.path)


def validation_body(errs: Any) -> dict[str, Any]:
    """The one error shape for FastAPI's validation errors: the first one, naming its field."""
    first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        # its loc is ("body", <char offset>): the offset is no field
        where = first.get("loc", ())[-1:]
        ctx = first.get("ctx")
        why = ctx.get("error", "") if isinstance(ctx, dict) else ""
        return {"code": "bad_request", "field": "body",
                "message": f"request body is not valid JSON ({why} at character "
                           f"{where[0] if where else '?'})"}
    field = field_of([p for p in first.get("loc", ()) if p not in ("body", "query", "path")])
    if field is None:
        # the body as a whole was not a JSON object (often: curl -d without a JSON
        # Content-Type, which FastAPI then does not parse as JSON)
        return {"code": "bad_request", "field": "body",
                "message": "request body must be a JSON object sent with 'Content-Type: "
                           f"application/json' ({first.get('msg')})"}
    # a model's own check (a ValueError) reads as its message, without pydantic's prefix
    msg = str(first.get("msg")).removeprefix("Value error, ")
    return {"code": "bad_request", "field": field, "message": f"field '{field}': {msg}"}


# The OpenAI routes' bodies are parsed and validated by FastAPI on the event loop (their
# schemas document the API); a prompt of 2 MiB is already far past any context, and parsing
# it stalls the loop for tens of milliseconds at most. Tensor bodies are parsed off the loop.
GENERATION_MAX_BODY = 2 * 1024 * 1024
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/api/chat",
                     "/api/generate", "/api/embed", "/api/embeddings", "/v1/embeddings")


class BodyLimit:
    """Refuse bodies over ``limit`` bytes before they are read into memory (413)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _limit_for(self, path: str) -> tuple[int, str]:
        if path in GENERATION_ROUTES and self.limit > GENERATION_MAX_BODY:
            return GENERATION_MAX_BODY, "for a generation request (its prompt must fit a context)"
        return self.limit, "([http] max_body_bytes)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, why = self._limit_for(str(scope.get("path", "")))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, receive, send, limit, why)
            return
        seen = 0
        # FastAPI parses these bodies itself, on the event loop: nesting is refused first
        chunks: list[bytes] | None = [] if scope.get("path") in GENERATION_ROUTES else None

        async def limited() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(limit, why)
                if chunks is not None:
                    chunks.append(message.get("body", b""))
                    if not message.get("more_body") and too_deep(b"".join(chunks)):
                        raise _TooDeep
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            # read outside the app's exception handling (e.g. by a middleware): answer here
            await self._refuse(scope, receive, send, limit, why)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, limit: int,
                      why: str) -> None:
        resp = http_error(413, {"code": "payload_too_large", "field": "body",
                                "message": f"request body over the {limit}-byte limit {why}"},
                          path=str(scope.get("path", "")))
        await resp(scope, receive, send)


class FormAsJson:
    """A generation route's body sent as a form (``curl -d @body.json`` without a JSON
    Content-Type: curl's default) is read as the JSON it is, as llama.cpp's server and
    Ollama's ``/v1`` read it; FastAPI would not parse it and the answer was a 400."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") in GENERATION_ROUTES:
            headers = scope.get("headers") or []
            if (b"content-type", b"application/x-www-form-urlencoded") in headers:
                scope = {**scope, "headers": [
                    (k, b"application/json" if k == b"content-type" else v)
                    for k, v in headers]}
        await self.app(scope, receive, send)


class _TooLarge(StarletteHTTPException):
    """Raised from ``receive`` while the body streams in (chunked, no Content-Length).

    An HTTPException so that FastAPI's body parser lets it through instead of turning it into
    its own ``400 There was an error parsing the body``; the app's handler answers the 413.
    """

    def __init__(self, limit: int, why: str) -> None:
        super().__init__(413, f"request body over the {limit}-byte limit {why}")


class _TooDeep(StarletteHTTPException):
    """A body nested past :data:`MAX_DEPTH`, refused as it is read (see ``_TooLarge``)."""

    def __init__(self) -> None:
        super().__init__(400, f"request body is nested more than {MAX_DEPTH} levels deep")


def create_app(api: HttpApi) -> FastAPI:
    """The API's routes over ``api``'s components, with the one error shape and body limits."""
    app = FastAPI(title="edgepilot", version=__version__,
                  description="Local API of the edgepilot daemon.")
    app.state.api = api

    @app.exception_handler(EdgepilotError)
    async def _edgepilot_error(request: Request, exc: EdgepilotError) -> JSONResponse:
        retry = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
        return http_error(exc.http_status, error_body(exc), retry, path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _starlette_error(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette logs the traceback and re-raises after this response is sent
        return http_error(500, {"code": "internal", "field": None,
                                "message": f"internal error: {type(exc).__name__}"},
                          path=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # a request that does not validate is a 400 naming the field, as a CommandError is
        # over MQTT and on the routes that validate their own bodies (OpenAI answers 400 too)
        return http_error(400, validation_body(exc.errors()), path=request.url.path)

    for module in (health, commands, profile, telemetry, config, openai, responses, ollama,
                   infer, plan):
        app.include_router(module.router)
    app.add_middleware(FormAsJson)
    app.add_middleware(BodyLimit, limit=api.config().http.max_body_bytes)
    app.add_middleware(LlmCors, origins=api.config().http.cors_origins)
    return app
