"""What the dispatcher needs from components above it, as protocols it can import.

The dispatcher sits below the serving layer and DVFS, yet finds model files through the model
registry, holds every device while it measures, and keys plans by the DVFS profile in force.
Those components are handed to it by the composition root; these protocols say exactly what
it may call on them.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol


class ModelFiles(Protocol):
    """The model registry, as the dispatcher sees it."""

    def resolve_path(self, name: str) -> Path:
        """The verified file of a configured model (NotFoundError for unknown names)."""

    def hold_devices(self) -> AbstractContextManager[Any]:
        """Hold every device queue for one timed round (a no-op outside a running daemon)."""


class ActiveProfile(Protocol):
    """The DVFS profile manager, as the dispatcher sees it: a plan is keyed by the profile
    in force, since clocks change every latency."""

    active_name: str | None
