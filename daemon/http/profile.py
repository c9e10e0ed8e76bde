"""``GET /v1/profile`` (active profile and clocks) and ``PUT /v1/profile`` (apply one).

REST spellings of the ``profile.get`` and ``profile.apply`` commands: they run through the
command registry like ``POST /v1/commands/{verb}`` and MQTT ``cmd/<verb>``, so the three agree
on validation and on what is mutating (the token).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from edgepilot.http.api import api_of
from edgepilot.http.auth import require_token

router = APIRouter()


class ProfileBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, description="Profile to apply.")


@router.get("/v1/profile", summary="Active DVFS profile and the board's current clocks")
async def get_profile(request: Request) -> dict[str, Any]:
    result: dict[str, Any] = await api_of(request).commands.execute("profile.get", {})
    return result


@router.put("/v1/profile", dependencies=[Depends(require_token)],
            summary="Apply a DVFS profile (rolled back entirely on failure)")
async def put_profile(request: Request, body: ProfileBody) -> dict[str, Any]:
    result: dict[str, Any] = await api_of(request).commands.execute("profile.apply",
                                                                    body.model_dump())
    return result
