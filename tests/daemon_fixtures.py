"""Parts of an in-process daemon built the way its composition root builds them."""

from __future__ import annotations

from edgepilot.board import Board
from edgepilot.lifecycle import Daemon
from edgepilot.telemetry.sampler import TelemetrySampler


def sampler_on(daemon: Daemon, board: Board | None) -> TelemetrySampler:
    """A telemetry sampler of ``daemon`` reading ``board`` (a fake tree, or None: no board),
    with the daemon's config, work meter, power history, event bus and readiness."""
    return TelemetrySampler(config=daemon.current_config, board=board, profiles=daemon.profiles,
                            work=daemon.work, power=daemon.power, events=daemon.events,
                            readiness=daemon.readiness, run_blocking=daemon.run_blocking,
                            state_dir=daemon.state_dir)
