"""The ``status`` command: what this daemon is and how it is doing."""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

from edgepilot import __version__
from edgepilot.commands import NoParams

if TYPE_CHECKING:
    from edgepilot.lifecycle import Daemon, Service


def status_snapshot(daemon: Daemon) -> dict[str, Any]:
    """Plain data shared by the status command, MQTT's retained status and the CLI."""
    board = getattr(daemon.board, "identity", None)
    profiles = daemon.profiles
    return {
        "version": __version__,
        "hostname": socket.gethostname(),
        "uptime_s": round(time.time() - daemon.started_at, 3),
        "ready": not daemon.not_ready_reasons(),
        "not_ready": daemon.not_ready_reasons(),
        "board": board.as_dict() if board is not None and hasattr(board, "as_dict") else None,
        "profile": getattr(profiles, "active_name", None),
        # vendor tools in use or skipped, thermal guard state: cheap, no board reads
        "dvfs": profiles.summary() if profiles is not None else None,
        "backends": getattr(daemon.models, "backend_names", lambda: [])()
        if daemon.models is not None else [],
        "http": daemon.http_server.url if daemon.http_server is not None else None,
    }


async def _status(daemon: Daemon, _: NoParams) -> dict[str, Any]:
    return status_snapshot(daemon)


def attach(daemon: Daemon) -> list[Service]:
    daemon.commands.register("status", NoParams, _status, summary="Daemon, board and profile")
    return []
