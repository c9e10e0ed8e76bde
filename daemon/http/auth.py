"""Bearer-token guard for mutating endpoints (only when ``[http] token`` is set)."""

from __future__ import annotations

import hmac

from fastapi import Request

from edgepilot.errors import EdgepilotError
from edgepilot.http.api import api_of


class Unauthorized(EdgepilotError):
    code = "unauthorized"
    http_status = 401


def require_token(request: Request) -> None:
    """FastAPI dependency: add ``dependencies=[Depends(require_token)]`` to mutating routes."""
    token = api_of(request).config().http.token
    if not token:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), token):
        raise Unauthorized("this endpoint needs 'Authorization: Bearer <token>' ([http] token)",
                           field="authorization")
