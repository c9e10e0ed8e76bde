"""Attach point of this capability (see edgepilot.lifecycle.CAPABILITIES)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgepilot.lifecycle import Daemon, Service


def attach(daemon: Daemon) -> list[Service]:
    return []
