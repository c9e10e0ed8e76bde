"""What the dispatcher needs from components above it, as protocols it can import.

The dispatcher sits below DVFS, yet keys plans by the DVFS profile in force. The profile
manager is handed to it by the composition root; this protocol says exactly what it may read.
"""

from __future__ import annotations

from typing import Protocol


class ActiveProfile(Protocol):
    """The DVFS profile manager, as the dispatcher sees it: a plan is keyed by the profile
    in force, since clocks change every latency."""

    active_name: str | None
