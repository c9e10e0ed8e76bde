"""``GET /v1/config``: the effective configuration, secrets redacted."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from edgepilot.http.api import api_of

router = APIRouter()

SECRET_KEYS = {"token", "password"}


def redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ("***" if k in SECRET_KEYS and v else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


@router.get("/v1/config", summary="Effective configuration (secrets redacted)")
async def get_config(request: Request) -> dict[str, Any]:
    """The config in effect: file, CLI overrides (``run --host/--port``) and the port bound."""
    api = api_of(request)
    config = api.config()
    data = config.model_dump(mode="json")
    # the address actually served: ``run --host/--port`` override the file, and port 0 is the
    # port the kernel picked, not 0 (nor the file's 8470)
    data["http"]["host"], data["http"]["port"] = api.address()
    data["daemon"]["state_dir"] = str(config.state_dir)
    data["daemon"]["model_dir"] = str(config.model_dir)
    return {"path": str(api.config_path) if api.config_path else None,
            "config": redact(data)}
