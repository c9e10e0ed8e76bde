"""The ``status`` command: what this daemon is and how it is doing."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from edgepilot import __version__
from edgepilot.board.board import Board
from edgepilot.command_registry import CommandRegistry, NoParams
from edgepilot.readiness import Readiness


class ProfileSummary(Protocol):
    """The DVFS profile manager, as status sees it (cheap reads, no board access)."""

    active_name: str | None

    def summary(self) -> dict[str, Any]: ...


class StatusReport:
    """Plain data shared by the status command, MQTT's retained status and the CLI."""

    def __init__(self, *, started_at: float, readiness: Readiness, board: Board | None,
                 profiles: ProfileSummary | None, backend_names: Callable[[], list[str]],
                 http_url: Callable[[], str | None]) -> None:
        self.started_at = started_at
        self.readiness = readiness
        self.board = board
        self.profiles = profiles
        self.backend_names = backend_names
        self.http_url = http_url

    def snapshot(self) -> dict[str, Any]:
        profiles = self.profiles
        reasons = self.readiness.reasons()
        return {
            "version": __version__,
            "hostname": socket.gethostname(),
            "uptime_s": round(time.time() - self.started_at, 3),
            "ready": not reasons,
            "not_ready": reasons,
            "board": self.board.identity.as_dict() if self.board is not None else None,
            "profile": profiles.active_name if profiles is not None else None,
            # vendor tools in use or skipped, thermal guard state: cheap, no board reads
            "dvfs": profiles.summary() if profiles is not None else None,
            "backends": self.backend_names(),
            "http": self.http_url(),
        }


def attach(commands: CommandRegistry, *, started_at: float, readiness: Readiness,
           board: Board | None, profiles: ProfileSummary | None,
           backend_names: Callable[[], list[str]],
           http_url: Callable[[], str | None]) -> StatusReport:
    """Build the status report and register ``status`` (answered by it); the report also
    feeds MQTT's retained status."""
    report = StatusReport(started_at=started_at, readiness=readiness, board=board,
                          profiles=profiles, backend_names=backend_names, http_url=http_url)

    async def status(_: NoParams) -> dict[str, Any]:
        return report.snapshot()

    commands.register("status", NoParams, status, summary="Daemon, board and profile")
    return report
