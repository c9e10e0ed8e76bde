"""One reading of a running daemon over its HTTP API, as plain data.

Read-only routes only: ``POST /v1/commands/status`` (a non-mutating verb), ``GET
/v1/telemetry``, ``/v1/profile``, ``/v1/models``, ``/v1/plan`` (plans in hand, none started)
and ``/v1/config``. A daemon that cannot be reached at all is a :class:`DaemonUnreachable`;
a route that fails on a reachable daemon (an older daemon without ``/v1/plan``, a profile
manager that cannot read the board) is kept in :attr:`Snapshot.errors` and the rest is shown.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from edgepilot.errors import EdgepilotError

DEFAULT_TIMEOUT_S = 5.0


class DaemonUnreachable(EdgepilotError):
    """Nothing answered at the URL, or what answered is not an edgepilot daemon."""

    code = "unreachable"


@dataclass
class Snapshot:
    """What the daemon said, route by route (empty where a route failed, see ``errors``)."""

    url: str
    taken_at: float  # wall clock, s
    status: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, Any] = field(default_factory=dict)
    models: list[dict[str, Any]] = field(default_factory=list)
    plans: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # effective config, redacted
    errors: dict[str, str] = field(default_factory=dict)  # route -> why it has no data

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``top --once --json``)."""
        return {"url": self.url, "taken_at": self.taken_at, "status": self.status,
                "telemetry": self.telemetry, "profile": self.profile, "models": self.models,
                "plans": self.plans, "config": self.config, "errors": self.errors}


def base_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for a daemon bound to ``host:port`` (a wildcard
    bind is reached on loopback)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _get(url: str, method: str = "GET", timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    data = b"{}" if method == "POST" else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Accept": "application/json",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _why(exc: Exception) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        try:
            err = json.loads(exc.read()).get("error", {})
            return f"HTTP {exc.code}: {err.get('message', exc.reason)}"
        except (ValueError, AttributeError, OSError):
            return f"HTTP {exc.code}: {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return f"{type(exc).__name__}: {exc}"


def fetch(url: str, timeout: float = DEFAULT_TIMEOUT_S) -> Snapshot:
    """Read every route once. Raises :class:`DaemonUnreachable` when the status command
    cannot be read (nothing listens, a timeout, or not an edgepilot daemon)."""
    url = url.rstrip("/")
    snap = Snapshot(url=url, taken_at=time.time())
    try:
        reply = _get(f"{url}/v1/commands/status", "POST", timeout)
    except (OSError, ValueError) as exc:
        raise DaemonUnreachable(
            f"cannot reach an edgepilot daemon at {url} ({_why(exc)}); is it running "
            "(`edgepilot run`)? pass its address with --url", field="url") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("result"), dict):
        raise DaemonUnreachable(f"{url} answered, but not like an edgepilot daemon (no status "
                                "result); pass the daemon's address with --url", field="url")
    snap.status = reply["result"]
    routes: list[tuple[str, str]] = [("telemetry", "/v1/telemetry"), ("profile", "/v1/profile"),
                                     ("models", "/v1/models"), ("plans", "/v1/plan"),
                                     ("config", "/v1/config")]
    for attr, route in routes:
        try:
            body = _get(url + route, timeout=timeout)
        except (OSError, ValueError) as exc:
            snap.errors[route] = _why(exc)
            continue
        if attr == "models":
            snap.models = [m for m in body.get("data", []) if isinstance(m, dict)]
        elif attr == "config":  # {"path": FILE or null, "config": {...}}
            snap.config = body.get("config") if isinstance(body.get("config"), dict) else {}
        elif isinstance(body, dict):
            setattr(snap, attr, body)
    return snap
