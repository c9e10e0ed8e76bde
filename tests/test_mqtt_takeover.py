"""Two daemons with one MQTT client id (issue 11, hole 8), against a real mosquitto.

Before: each connect kicked the other off, every second, and the log said only "connection lost
(Unspecified error)". Now the daemon whose session was taken says so (a log line naming the
client id, a ``mqtt.session_taken_over`` event on the bus) and backs off, doubling its wait
while it repeats, instead of taking the session straight back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mqtt_fixtures import (  # noqa: F401
    Broker,
    InProcessDaemon,
    Recorder,
    broker,
    wait_for,
)

from edgepilot.mqtt.takeover import SESSION_TAKEN_OVER, TakeoverGuard

CLIENT_ID = "edgepilot-cloned-board"


@pytest.fixture
def pair(tmp_path: Path, broker: Broker, request: pytest.FixtureRequest  # noqa: F811
         ) -> Iterator[tuple[InProcessDaemon, InProcessDaemon]]:
    protocol = request.param
    made = [InProcessDaemon(tmp_path / f"state{i}", broker,
                            mqtt_cfg={"device_id": f"dev{i}", "client_id": CLIENT_ID,
                                      "protocol": protocol})
            for i in (1, 2)]
    yield made[0], made[1]
    for d in made:
        d.stop()


def takeovers(rec: Recorder) -> list[dict[str, Any]]:
    return [e for topic in ("edgepilot/dev1/events", "edgepilot/dev2/events")
            for e in rec.json_on(topic) if e.get("type") == "mqtt.session_taken_over"]


@pytest.mark.parametrize("pair", ["5", "3.1.1"], indirect=True)
def test_a_session_taken_over_is_reported_and_not_fought_over(
        pair: tuple[InProcessDaemon, InProcessDaemon], broker: Broker,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="edgepilot.mqtt")
    a, b = pair
    rec = Recorder(broker, ["edgepilot/+/events"])
    try:
        a.start()
        wait_for(lambda: a.daemon.mqtt.link.connected, what="first daemon connected")
        b.start()
        links = [a.daemon.mqtt.link, b.daemon.mqtt.link]
        # four takeovers between them: each one's wait doubles while the other holds on
        wait_for(lambda: sum(link.takeover.total for link in links) >= 4, timeout=60,
                 what="four takeovers")
        total = sum(link.takeover.total for link in links)
        connects = sum(link.connects for link in links)
        # not a tight loop: a takeover is told at once (MQTT 5 reason code 142) or by three
        # sessions cut short in a row (3.1.1; mosquitto 2.0 says nothing on MQTT 5 either)
        assert connects <= 3 * total + 3, (connects, total)
        # reported on the bus (sent once the reporting daemon holds the session again)
        events = wait_for(lambda: takeovers(rec) if len(takeovers(rec)) >= 2 else None,
                          timeout=60, what="mqtt.session_taken_over events on the bus")
        assert all(e["client_id"] == CLIENT_ID for e in events), events
        by_device: dict[str, list[float]] = {}
        for topic in ("edgepilot/dev1/events", "edgepilot/dev2/events"):
            by_device[topic] = [e["backoff_s"] for e in rec.json_on(topic)
                                if e.get("type") == "mqtt.session_taken_over"]
        for waits in by_device.values():
            assert waits == sorted(waits) and len(set(waits)) == len(waits), by_device
        v5 = a.daemon.config.mqtt.protocol == "5"
        want = {"short_sessions"} | ({"reason_code_142"} if v5 else set())
        assert {e["detected_by"] for e in events} <= want, events
        # and in the log: one line naming the client id and what happened
        lines = [r.getMessage() for r in caplog.records if "taken over" in r.getMessage()]
        assert lines, [r.getMessage() for r in caplog.records]
        assert f"client id {CLIENT_ID!r}" in lines[0]
        assert "another client with the same client id" in lines[0]
        # while taken over, the telemetry report says why it is not connected. Waited for, not
        # read in one snapshot: on 3.1.1 a link cut in the first two short sessions of a new
        # streak is not yet known to be taken over, and says "connection lost" until the third
        wait_for(lambda: any(not link.connected and "taken over" in (link.last_error or "")
                             for link in links), timeout=60,
                 what="a link waiting out its backoff, its last error naming the takeover")
        for link in links:
            if link._backoff_task is not None and not link.connected:
                assert "taken over" in (link.last_error or ""), link.last_error
    finally:
        rec.close()


def test_reason_code_142_is_a_takeover_at_once_and_the_wait_doubles() -> None:
    """MQTT 5 brokers that send DISCONNECT 142 (mosquitto 2.0.11 does not, so no broker here
    can): told at once; a failed connect between short sessions (a broker restarting) is no
    takeover."""
    guard = TakeoverGuard("cid", v5=True, base_backoff_s=2.0)
    waits = []
    for _ in range(3):
        guard.session_up()
        taken = guard.session_down(SESSION_TAKEN_OVER)
        assert taken is not None and taken.detected_by == "reason_code_142"
        assert "'cid'" in taken.message()
        waits.append(taken.backoff_s)
    assert waits == [2.0, 4.0, 8.0]
    other = TakeoverGuard("cid", v5=False, base_backoff_s=1.0)
    for _ in range(5):  # short sessions, each after a refused connect: a restarting broker
        other.session_up()
        assert other.session_down(128) is None
        other.connect_failed()
    assert other.total == 0
