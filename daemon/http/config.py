"""``GET /v1/config``: the effective configuration, secrets redacted."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

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
    daemon = request.app.state.daemon
    data = daemon.config.model_dump(mode="json")
    server = daemon.http_server
    # the address actually served: ``run --host/--port`` override the file, and port 0 is the
    # port the kernel picked, not 0 (nor the file's 8470)
    data["http"]["host"] = server.host if server is not None else daemon.http_host
    data["http"]["port"] = server.port if server is not None else daemon.http_port
    data["daemon"]["state_dir"] = str(daemon.state_dir)
    data["daemon"]["model_dir"] = str(daemon.model_dir)
    return {"path": str(daemon.config_path) if daemon.config_path else None,
            "config": redact(data)}
