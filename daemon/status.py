"""The ``status`` command: what this daemon is and how it is doing."""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

from edgepilot import __version__
from edgepilot.command_registry import NoParams

if TYPE_CHECKING:
    from edgepilot.lifecycle import Daemon, Service


def status_snapshot(daemon: Daemon) -> dict[str, Any]:
    """Plain data shared by the status command, MQTT's retained status and the CLI."""
    profiles = daemon.profiles
    return {
        "version": __version__,
        "hostname": socket.gethostname(),
        "uptime_s": round(time.time() - daemon.started_at, 3),
        "ready": not daemon.not_ready_reasons(),
        "not_ready": daemon.not_ready_reasons(),
        "board": daemon.board.identity.as_dict() if daemon.board is not None else None,
        "profile": profiles.active_name if profiles is not None else None,
        # vendor tools in use or skipped, thermal guard state: cheap, no board reads
        "dvfs": profiles.summary() if profiles is not None else None,
        "backends": daemon.models.backend_names(),
        "http": daemon.http_server.url if daemon.http_server is not None else None,
    }


async def _status(daemon: Daemon, _: NoParams) -> dict[str, Any]:
    return status_snapshot(daemon)


def attach(daemon: Daemon) -> list[Service]:
    daemon.commands.register("status", NoParams, _status, summary="Daemon, board and profile")
    return []
