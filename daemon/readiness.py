"""Readiness: which components are not ready yet, and why, in words an operator can act on.

The composition root owns one; each service marks itself ready (reason None) or not, and
``/readyz``, ``status`` and MQTT's retained status read it.
"""

from __future__ import annotations


class Readiness:
    """Component -> reason it is not ready (absent or None = ready); plus the daemon stopping."""

    def __init__(self) -> None:
        self._reasons: dict[str, str | None] = {}
        # set once shutdown starts: /readyz answers 503 from then on
        self.stopping = False

    def set(self, component: str, reason: str | None = None) -> None:
        """Mark ``component`` ready (reason None) or not ready with an operator-readable reason.

        A plain dict assignment: safe from worker threads and event subscribers."""
        self._reasons[component] = reason

    def get(self, component: str) -> str | None:
        """Why ``component`` is not ready (None: ready, or never reported)."""
        return self._reasons.get(component)

    def reasons(self) -> dict[str, str]:
        """The components not ready now, with why."""
        return {k: v for k, v in list(self._reasons.items()) if v}
