"""Reliability suite, MQTT, against a real mosquitto and the daemon's real MQTT services.

- Hypothesis-generated command payloads (deep nesting, sizes over the limit, every JSON type,
  unicode, bytes that are not UTF-8, binary infer with any content type, verbs known and not):
  every one answered on its response topic with its correlation data, none an internal error.
- The broker restarted 10 times under telemetry: the daemon buffers while it is away and the
  telemetry received has no gap in ``seq``, and no restart is mistaken for a session takeover.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mqtt_fixtures import (  # noqa: F401
    Broker,
    InProcessDaemon,
    Recorder,
    broker,
    wait_for,
)
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

BASE = "edgepilot/dev1"
MAX_PAYLOAD = 4096
REPLIES = "fuzz/replies"
# hypothesis examples x messages per example: >= 2,000 payloads, each answered
EXAMPLES = 100
PER_EXAMPLE = (20, 25)  # under the transport's 32 commands in flight, so none is "busy"


@pytest.fixture
def daemon(tmp_path: Path, broker: Broker) -> Iterator[InProcessDaemon]:  # noqa: F811
    d = InProcessDaemon(tmp_path / "state", broker,
                        mqtt_cfg={"max_payload_bytes": MAX_PAYLOAD},
                        telemetry={"sample_interval_s": 0.1, "publish_interval_s": 0.2})
    d.start()
    wait_for(lambda: d.daemon.mqtt.link.connected, what="daemon connected")
    try:
        yield d
    finally:
        d.stop()


class Asker:
    """An MQTT 5 client sending commands with a response topic and correlation data."""

    def __init__(self, brk: Broker) -> None:
        self.replies: dict[bytes, list[mqtt.MQTTMessage]] = {}
        self.cond = threading.Condition()
        subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *a: subscribed.set()
        self.client.connect(brk.host, brk.port)
        self.client.loop_start()
        self.client.subscribe(f"{REPLIES}/#", qos=1)
        wait_for(subscribed.is_set, what="asker subscribed")

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        corr = getattr(msg.properties, "CorrelationData", None) or b""
        with self.cond:
            self.replies.setdefault(bytes(corr), []).append(msg)
            self.cond.notify_all()

    def send(self, verb: str, payload: bytes, content_type: str | None) -> bytes:
        corr = uuid.uuid4().bytes
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = REPLIES
        props.CorrelationData = corr
        if content_type is not None:
            props.ContentType = content_type
        self.client.publish(f"{BASE}/cmd/{verb}", payload, qos=1, properties=props)
        return corr

    def wait_all(self, corrs: list[bytes], timeout: float = 60.0) -> list[mqtt.MQTTMessage]:
        with self.cond:
            ok = self.cond.wait_for(lambda: all(c in self.replies for c in corrs), timeout)
            missing = [c for c in corrs if c not in self.replies]
            assert ok, f"{len(missing)} of {len(corrs)} commands unanswered"
            return [self.replies[c][0] for c in corrs]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


leaves = (st.none() | st.booleans() | st.integers() | st.floats()
          | st.text(max_size=40))
json_values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=5),
                           max_leaves=25)
param_keys = st.sampled_from(["model", "name", "file", "inputs", "timeout_ms", "id",
                              "reply_to", "reprofile"]) | st.text(max_size=8)
tensors = st.dictionaries(st.text(min_size=1, max_size=6), st.fixed_dictionaries(
    {"data": json_values, "shape": st.lists(st.integers(-2, 2**40) | st.booleans(), max_size=4),
     "dtype": st.sampled_from(["float32", "int64", "bool", "object", "x"])}), max_size=2)
payloads = st.one_of(
    st.dictionaries(param_keys, json_values, max_size=4).map(_dumps),
    st.fixed_dictionaries({"model": st.text(max_size=10), "inputs": tensors}).map(_dumps),
    json_values.map(_dumps),
    # nesting past the parser's recursion limit, lists and objects
    st.integers(900, 1900).flatmap(lambda n: st.sampled_from(
        [b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n])),
    st.binary(max_size=600),  # mostly not UTF-8
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(MAX_PAYLOAD + 1, 3 * MAX_PAYLOAD).map(lambda n: b"[" + b"0," * (n // 2) + b"0]"),
)
verbs = (st.sampled_from(["status", "telemetry.get", "model.list", "model.load",
                          "model.unload", "infer", "plan.get", "profile.apply"])
         | st.from_regex(r"[A-Za-z0-9._-]{1,16}", fullmatch=True))
messages = st.tuples(verbs, payloads,
                     st.sampled_from([None, None, "application/json", "application/x-npz",
                                      "text/plain"]))


def test_generated_command_payloads_are_each_answered_none_internal(
        daemon: InProcessDaemon, broker: Broker,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    asker = Asker(broker)
    sent = 0
    codes: dict[str, int] = {}
    try:
        @given(batch=st.lists(messages, min_size=PER_EXAMPLE[0], max_size=PER_EXAMPLE[1]))
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(batch: list[tuple[str, bytes, str | None]]) -> None:
            nonlocal sent
            corrs = [asker.send(*m) for m in batch]
            sent += len(corrs)
            for (verb, payload, _), reply in zip(batch, asker.wait_all(corrs), strict=True):
                body = json.loads(reply.payload)
                assert isinstance(body.get("ok"), bool), body
                if not body["ok"]:
                    err = body["error"]
                    codes[err["code"]] = codes.get(err["code"], 0) + 1
                    assert err["code"] != "internal", (verb, payload[:200], err)
                    assert err["message"], err

        run()
    finally:
        asker.close()
    assert sent >= 2000, sent
    # the generator reached the refusals it was written for
    assert {"bad_request", "not_found"} <= set(codes), codes
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], errors[:5]


def test_ten_broker_restarts_under_telemetry_leave_no_seq_gap(
        daemon: InProcessDaemon, broker: Broker) -> None:  # noqa: F811
    rec = Recorder(broker, [f"{BASE}/telemetry"], client_id="seq-watcher", persistent=True)
    link = daemon.daemon.mqtt.link
    try:
        wait_for(lambda: len(rec.on(f"{BASE}/telemetry")) >= 3, what="telemetry flowing")
        for _ in range(10):
            broker.stop()
            # publish periods with the broker away: reports pile up in the outbox
            wait_for(lambda: len(daemon.daemon.mqtt.outbox) >= 2, what="telemetry buffered")
            high = daemon.daemon.telemetry.seq.last
            broker.start()
            wait_for(lambda h=high: seqs(rec) and max(seqs(rec)) > h,
                     what="buffered telemetry delivered after the restart")
        got = sorted(set(seqs(rec)))  # QoS 1: a repeat is possible, a gap is not
        assert got == list(range(got[0], got[-1] + 1)), _gaps(got)
        assert daemon.daemon.mqtt.outbox.dropped == 0
        assert link.takeover.total == 0  # a restarting broker is no takeover
    finally:
        rec.close()


def seqs(rec: Recorder) -> list[int]:
    return [int(m["seq"]) for m in rec.json_on(f"{BASE}/telemetry")]


def _gaps(got: list[int]) -> list[tuple[int, int]]:
    return [(a, b) for a, b in itertools.pairwise(got) if b != a + 1]
