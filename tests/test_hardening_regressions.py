"""Regression tests for issue 11 holes whose fixes had none of their own.

- Hole 1 (MQTT): JSON nested deeper than the parser recurses got no reply at all; now an error
  reply naming the payload.
- Hole 3: an MQTT 5 response topic could aim a reply at this device's telemetry or at another
  device's command topic; now refused, the error going to the default reply topic instead.
- Hole 6: request bodies are parsed off the event loop, never more than ``MAX_PARSING`` at once.
"""

from __future__ import annotations

import asyncio
import threading
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
from test_mqtt import BASE, publish_v5

from edgepilot.serving.offload import MAX_PARSING, off_loop


@pytest.fixture
def daemon(tmp_path: Path, broker: Broker) -> Iterator[InProcessDaemon]:  # noqa: F811
    d = InProcessDaemon(tmp_path / "state", broker).start()
    wait_for(lambda: d.daemon.mqtt.link.connected, what="daemon connected")
    try:
        yield d
    finally:
        d.stop()


def test_deeply_nested_mqtt_command_gets_an_error_reply(daemon: InProcessDaemon,
                                                       broker: Broker) -> None:  # noqa: F811
    rec = Recorder(broker, ["deep/#"])
    try:
        for i, payload in enumerate([b"[" * 5000 + b"]" * 5000,
                                     b'{"a":' * 3000 + b"1" + b"}" * 3000]):
            publish_v5(broker, f"{BASE}/cmd/status", payload, response_topic=f"deep/{i}",
                       correlation=b"d%d" % i)
            reply = wait_for(lambda i=i: rec.json_on(f"deep/{i}"), what="reply to deep JSON")[0]
            assert reply["ok"] is False and reply["error"]["field"] == "payload", reply
            assert reply["error"]["code"] == "bad_request", reply
    finally:
        rec.close()


@pytest.mark.parametrize("target", [f"{BASE}/telemetry", f"{BASE}/events", f"{BASE}/status",
                                    "edgepilot/other-board/cmd/profile.apply",
                                    "edgepilot/group/all/cmd/model.unload"])
def test_response_topic_cannot_aim_a_reply_at_our_or_another_devices_topics(
        daemon: InProcessDaemon, broker: Broker, target: str) -> None:  # noqa: F811
    rec = Recorder(broker, ["edgepilot/#"])
    try:
        publish_v5(broker, f"{BASE}/cmd/status", b"{}", response_topic=target,
                   correlation=b"aim")
        reply = wait_for(lambda: rec.json_on(f"{BASE}/reply/status"),
                         what="error reply on the default reply topic")[0]
        assert reply["ok"] is False and reply["error"]["field"] == "response_topic", reply
        assert not [m for m in rec.on(target) if b'"ok"' in m.payload], target
        # a response topic of this device's own (not reserved) is still served
        publish_v5(broker, f"{BASE}/cmd/status", b"{}", response_topic=f"{BASE}/reply/mine",
                   correlation=b"mine")
        assert wait_for(lambda: rec.json_on(f"{BASE}/reply/mine"),
                        what="reply on an allowed topic")[0]["ok"] is True
    finally:
        rec.close()


def test_bodies_are_parsed_off_the_loop_a_bounded_number_at_once() -> None:
    running = 0
    most = 0
    lock = threading.Lock()
    release = threading.Event()
    loop_thread: list[int] = []

    def parse(n: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        assert threading.get_ident() not in loop_thread  # never on the event loop's thread
        release.wait(30)
        with lock:
            running -= 1
        return n

    async def main() -> list[Any]:
        loop_thread.append(threading.get_ident())
        tasks = [asyncio.ensure_future(off_loop(parse, i)) for i in range(3 * MAX_PARSING)]
        # the loop keeps running while every parsing slot is taken
        for _ in range(200):
            await asyncio.sleep(0.01)
            with lock:
                if running == MAX_PARSING:
                    break
        with lock:
            assert running == MAX_PARSING
        release.set()
        return list(await asyncio.gather(*tasks))

    assert asyncio.run(main()) == list(range(3 * MAX_PARSING))
    assert most == MAX_PARSING
