"""The redelivery memory never forgets a command that is still running."""

from __future__ import annotations

from typing import Any

from edgepilot.mqtt.commands import _PENDING, DEDUP_SIZE, CommandTransport


def test_running_commands_survive_eviction_and_finished_ones_are_bounded() -> None:
    sent: list[Any] = []
    t = CommandTransport(None, None, sent.append, qos=1, v5=True,  # type: ignore[arg-type]
                         max_payload_bytes=1024)
    t._remember(("r", "running"), _PENDING)
    for i in range(DEDUP_SIZE * 2):
        t._remember(("r", f"done-{i}"), {"ok": True})
    assert ("r", "running") in t._seen          # would be re-run on redelivery otherwise
    assert len(t._seen) == DEDUP_SIZE           # still bounded
    assert ("r", "done-0") not in t._seen       # the oldest finished replies went first
    assert ("r", f"done-{DEDUP_SIZE * 2 - 1}") in t._seen
