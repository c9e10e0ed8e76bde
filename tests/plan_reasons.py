"""What a plan's ``reason`` says about where it came from, for the tests that share plans."""

from __future__ import annotations


def planned_here(reason: str) -> bool:
    """Measured and planned on this board: "initial", or the single target that plan lost to
    side by side (a verdict of this machine's timing at that moment, see planning/versus.py),
    as opposed to "fleet" (adopted) or "cache"."""
    return reason == "initial" or reason.startswith("single target")
