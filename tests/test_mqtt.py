"""MQTT against a real mosquitto: status/will, commands and replies, buffering, spool, discovery.

The daemon side runs in-process (status + telemetry + MQTT services on their own loop thread);
the full-daemon subprocess tests are in test_mqtt_e2e.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from mqtt_fixtures import (  # noqa: F401
    Broker,
    InProcessDaemon,
    Recorder,
    broker,
    make_test_ca,
    wait_for,
)
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import BaseModel, ConfigDict

from edgepilot.errors import CommandError, ConfigError
from edgepilot.mqtt.outbox import Outbox, OutMessage
from edgepilot.mqtt.topics import Topics

BASE = "edgepilot/dev1"


@pytest.fixture
def running(tmp_path: Path, broker: Broker) -> Iterator[Any]:  # noqa: F811
    """Factory for in-process daemons on the test broker; all stopped at teardown."""
    made: list[InProcessDaemon] = []

    def make(**kw: Any) -> InProcessDaemon:
        d = InProcessDaemon(tmp_path / f"state{len(made)}", broker, **kw)
        made.append(d)
        d.start()
        wait_for(lambda: d.daemon.mqtt.link.connected, what="daemon connected to the broker")
        return d

    yield make
    for d in made:
        d.stop()


def publish_v5(brk: Broker, topic: str, payload: bytes | str, *,
               response_topic: str | None = None, correlation: bytes | None = None) -> None:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    c.connect(brk.host, brk.port)
    c.loop_start()
    props = Properties(PacketTypes.PUBLISH)
    if response_topic:
        props.ResponseTopic = response_topic
    if correlation:
        props.CorrelationData = correlation
    c.publish(topic, payload, qos=1, properties=props).wait_for_publish(10)
    c.disconnect()
    c.loop_stop()


def publish_v311(brk: Broker, topic: str, payload: bytes | str) -> None:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    c.connect(brk.host, brk.port)
    c.loop_start()
    c.publish(topic, payload, qos=1).wait_for_publish(10)
    c.disconnect()
    c.loop_stop()


# ---- pure parts --------------------------------------------------------------------------------
def test_topics_and_reply_to_rules() -> None:
    t = Topics("edgepilot", "dev1", ("lab",))
    assert t.subscriptions() == [f"{BASE}/cmd/+", "edgepilot/group/lab/cmd/+"]
    assert t.verb_of(f"{BASE}/cmd/profile.apply") == "profile.apply"
    assert t.verb_of("edgepilot/group/lab/cmd/status") == "status"
    assert t.verb_of("edgepilot/group/other/cmd/status") is None
    assert t.verb_of(f"{BASE}/telemetry") is None
    assert t.check_reply_to(f"{BASE}/reply/client7") == f"{BASE}/reply/client7"
    for bad, why in [("edgepilot/dev2/reply/x", "namespace"), (f"{BASE}/reply/+", "wildcards"),
                     (f"{BASE}/cmd/status", "reserved"), (f"{BASE}/status", "reserved"),
                     (42, "non-empty")]:
        with pytest.raises(CommandError, match=why) as exc:
            t.check_reply_to(bad)
        assert exc.value.field == "reply_to"


def test_outbox_drops_oldest_and_spools(tmp_path: Path) -> None:
    box = Outbox(3, tmp_path / "spool.jsonl")
    for i in range(5):
        box.put(OutMessage("t", f"{i}".encode()))
    box.put(OutMessage("r", b"reply", spool=False))
    assert box.dropped == 3 and len(box) == 3
    assert box.save() == 2  # the reply is not spooled
    again = Outbox(10, tmp_path / "spool.jsonl")
    again.put(OutMessage("t", b"new"))
    assert again.load() == 2
    got = [again.pop() for _ in range(3)]
    assert [m.payload for m in got if m] == [b"3", b"4", b"new"]
    again.save(force=True)
    assert not (tmp_path / "spool.jsonl").exists()  # empty buffer: no stale spool left


# ---- status and will ---------------------------------------------------------------------------
def test_retained_status_online_then_offline_on_clean_stop(running: Any, broker: Broker) -> None:  # noqa: F811
    d = running()
    rec = Recorder(broker, [f"{BASE}/status"])
    try:
        online = wait_for(lambda: rec.json_on(f"{BASE}/status"), what="retained status")
        msg = rec.on(f"{BASE}/status")[0]
        assert msg.retain and online[0]["state"] == "online"
        assert online[0]["device_id"] == "dev1" and "version" in online[0]
        assert "telemetry.get" not in online[0]  # it is a status, not a command list
        d.stop()
        offline = wait_for(lambda: [m for m in rec.json_on(f"{BASE}/status")
                                    if m["state"] == "offline"], what="offline status")
        assert offline[-1]["reason"] == "stopped"
    finally:
        rec.close()
    late = Recorder(broker, [f"{BASE}/status"])  # a newcomer sees the retained offline
    try:
        got = wait_for(lambda: late.json_on(f"{BASE}/status"), what="retained offline")
        assert got[-1]["state"] == "offline"
    finally:
        late.close()


# ---- commands ------------------------------------------------------------------------------
class CountParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = 1


def add_counting_verb(d: InProcessDaemon) -> list[int]:
    """A real verb whose runs the test can count (a command like any other)."""
    calls: list[int] = []

    async def handler(params: CountParams) -> dict[str, int]:
        calls.append(params.n)
        return {"count": len(calls), "n": params.n}

    d.daemon.commands.register("test.count", CountParams, handler, mutating=True)
    return calls


def test_v5_response_topic_correlation_and_redelivery(running: Any, broker: Broker) -> None:  # noqa: F811
    d = running()
    calls = add_counting_verb(d)
    rec = Recorder(broker, ["replies/#"])
    try:
        publish_v5(broker, f"{BASE}/cmd/test.count", json.dumps({"n": 5}),
                   response_topic="replies/a", correlation=b"req-1")
        wait_for(lambda: rec.on("replies/a"), what="reply")
        first = rec.on("replies/a")[0]
        assert json.loads(first.payload) == {"ok": True, "result": {"count": 1, "n": 5}}
        assert first.properties.CorrelationData == b"req-1"
        # QoS 1 redelivery of the same request: same reply, not run again
        publish_v5(broker, f"{BASE}/cmd/test.count", json.dumps({"n": 5}),
                   response_topic="replies/a", correlation=b"req-1")
        wait_for(lambda: len(rec.on("replies/a")) == 2, what="replayed reply")
        assert json.loads(rec.on("replies/a")[1].payload) == json.loads(first.payload)
        assert calls == [5]
        # a new correlation id runs again
        publish_v5(broker, f"{BASE}/cmd/test.count", "{}", response_topic="replies/a",
                   correlation=b"req-2")
        wait_for(lambda: len(rec.on("replies/a")) == 3, what="second reply")
        assert json.loads(rec.on("replies/a")[2].payload)["result"]["count"] == 2
        # telemetry.get over MQTT answers with the sampler's snapshot
        publish_v5(broker, f"{BASE}/cmd/telemetry.get", "", response_topic="replies/t",
                   correlation=b"t")
        snap = wait_for(lambda: rec.json_on("replies/t"), what="telemetry.get reply")[0]
        assert snap["ok"] and "cpu_util_pct" in snap["result"] and "seq" in snap["result"]
    finally:
        rec.close()


def test_malformed_commands_get_error_replies_and_telemetry_goes_on(
        running: Any, broker: Broker) -> None:  # noqa: F811
    d = running(mqtt_cfg={"max_payload_bytes": 1024})
    rec = Recorder(broker, ["r/#", f"{BASE}/reply/#", f"{BASE}/telemetry"])
    cases = [
        ("status", b"{not json", "bad_request", "payload"),
        ("status", b"x" * 2000, "bad_request", "payload"),
        ("no.such.verb", b"{}", "not_found", "verb"),
        ("telemetry.get", b'{"bogus": 1}', "bad_request", "bogus"),
        ("status", b"[1, 2]", "bad_request", "params"),
        ("status", b"\xff\xfe", "bad_request", "payload"),
    ]
    try:
        for i, (verb, payload, _code, _field) in enumerate(cases):
            publish_v5(broker, f"{BASE}/cmd/{verb}", payload, response_topic=f"r/{i}",
                       correlation=f"c{i}".encode())
        for i, (_verb, _payload, code, field) in enumerate(cases):
            reply = wait_for(lambda i=i: rec.json_on(f"r/{i}"), what=f"error reply {i}")[0]
            assert reply["ok"] is False, reply
            assert reply["error"]["code"] == code, reply
            assert reply["error"]["field"] == field, reply
        # without a response topic, the reply goes to the device's default reply topic
        publish_v5(broker, f"{BASE}/cmd/nope", b"{}")
        wait_for(lambda: rec.json_on(f"{BASE}/reply/nope"), what="default reply topic")
        before = d.report()["seq"]
        seqs = wait_for(lambda: [m["seq"] for m in rec.json_on(f"{BASE}/telemetry")
                                 if m["seq"] >= before], what="telemetry after bad commands")
        assert seqs[0] == before
    finally:
        rec.close()


def test_wildcard_response_topic_gets_an_error_reply_and_replies_go_on(
        running: Any, broker: Broker) -> None:  # noqa: F811
    running()
    rec = Recorder(broker, ["ok/#", f"{BASE}/reply/#"])
    try:
        publish_v5(broker, f"{BASE}/cmd/status", b"{}", response_topic="ok/#",
                   correlation=b"w1")
        reply = wait_for(lambda: rec.json_on(f"{BASE}/reply/status"), what="error reply")[0]
        assert reply["ok"] is False and reply["error"]["field"] == "response_topic", reply
        publish_v5(broker, f"{BASE}/cmd/status", b"{}", response_topic="ok/r", correlation=b"w2")
        assert wait_for(lambda: rec.json_on("ok/r"), what="next reply")[0]["ok"] is True
    finally:
        rec.close()


def test_mqtt311_reply_to_and_id(running: Any, broker: Broker) -> None:  # noqa: F811
    d = running(mqtt_cfg={"protocol": "3.1.1", "groups": ["lab"]})
    calls = add_counting_verb(d)
    rec = Recorder(broker, [f"{BASE}/reply/#"], v5=False)
    try:
        body = {"id": "abc", "reply_to": f"{BASE}/reply/me", "n": 3}
        publish_v311(broker, f"{BASE}/cmd/test.count", json.dumps(body))
        reply = wait_for(lambda: rec.json_on(f"{BASE}/reply/me"), what="3.1.1 reply")[0]
        assert reply == {"ok": True, "result": {"count": 1, "n": 3}, "id": "abc"}
        publish_v311(broker, f"{BASE}/cmd/test.count", json.dumps(body))  # redelivered
        wait_for(lambda: len(rec.on(f"{BASE}/reply/me")) == 2, what="replayed 3.1.1 reply")
        assert calls == [3]
        # reply_to outside the namespace: refused, answered on the default reply topic
        publish_v311(broker, f"{BASE}/cmd/test.count",
                     json.dumps({"id": "x", "reply_to": "elsewhere/steal"}))
        err = wait_for(lambda: rec.json_on(f"{BASE}/reply/test.count"), what="refusal")[0]
        assert err["ok"] is False and err["error"]["field"] == "reply_to"
        assert calls == [3]
        # group topic
        publish_v311(broker, "edgepilot/group/lab/cmd/test.count",
                     json.dumps({"reply_to": f"{BASE}/reply/grp", "n": 9}))
        wait_for(lambda: rec.json_on(f"{BASE}/reply/grp"), what="group reply")
        assert calls == [3, 9]
    finally:
        rec.close()


# ---- buffering ----------------------------------------------------------------------------
def telemetry_seqs(rec: Recorder) -> list[int]:
    return [m["seq"] for m in rec.json_on(f"{BASE}/telemetry")]


def test_broker_restart_loses_nothing_and_keeps_order(running: Any, broker: Broker) -> None:  # noqa: F811
    d = running(telemetry={"sample_interval_s": 0.1, "publish_interval_s": 0.2})
    rec = Recorder(broker, [f"{BASE}/telemetry"], client_id="watcher", persistent=True)
    try:
        wait_for(lambda: len(telemetry_seqs(rec)) >= 3, what="telemetry flowing")
        broker.stop()
        # several publish periods with the broker away: they pile up in the outbox
        wait_for(lambda: len(d.daemon.mqtt.outbox) >= 5, what="messages buffered")
        high = d.daemon.telemetry.seq.last
        broker.start()
        wait_for(lambda: telemetry_seqs(rec) and telemetry_seqs(rec)[-1] >= high + 3,
                 what="buffered telemetry delivered after restart")
        # every seq, in order; QoS 1 is at least once, so one in flight at the stop may come
        # twice (first arrivals are what count: the consumer drops a seq it has seen)
        seqs = list(dict.fromkeys(telemetry_seqs(rec)))
        assert seqs == list(range(seqs[0], seqs[-1] + 1)), telemetry_seqs(rec)
        assert d.daemon.mqtt.outbox.dropped == 0
        status = [m["state"] for m in rec.json_on(f"{BASE}/status")]
        assert status == []  # not subscribed: sanity of the filter
    finally:
        rec.close()


def test_overflow_drops_oldest_and_reports_dropped(tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    # the watcher's persistent session is made while the broker is up, then the broker goes
    rec = Recorder(broker, [f"{BASE}/telemetry"], client_id="w2", persistent=True)
    rec.client.disconnect()
    rec.client.loop_stop()
    broker.stop()
    d = InProcessDaemon(tmp_path / "state", broker, mqtt_cfg={"buffer_size": 10}).start()
    try:
        reports = [d.report() for _ in range(25)]
        assert len(d.daemon.mqtt.outbox) == 10 and d.daemon.mqtt.outbox.dropped == 15
        broker.start()
        rec2 = Recorder(broker, [f"{BASE}/telemetry"], client_id="w2", persistent=True)
        try:
            want = [r["seq"] for r in reports[-10:]]
            wait_for(lambda: telemetry_seqs(rec2)[-1:] == want[-1:], what="the last 10")
            assert telemetry_seqs(rec2) == want
            after = d.report()
            assert after["dropped"] == 15 and after["buffered"] == 0
            wait_for(lambda: after["seq"] in telemetry_seqs(rec2), what="live telemetry")
        finally:
            rec2.close()
    finally:
        d.stop()


def test_spool_survives_a_restart_and_seq_keeps_rising(tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    state = tmp_path / "state"
    rec = Recorder(broker, [f"{BASE}/telemetry"], client_id="w3", persistent=True)
    rec.client.disconnect()
    rec.client.loop_stop()
    broker.stop()
    d = InProcessDaemon(state, broker, mqtt_cfg={"spool": True}).start()
    spooled = [d.report()["seq"] for _ in range(5)]
    d.stop()
    lines = (state / "mqtt-spool.jsonl").read_text().splitlines()
    assert len(lines) == 5
    broker.start()
    rec2 = Recorder(broker, [f"{BASE}/telemetry"], client_id="w3", persistent=True)
    d2 = InProcessDaemon(state, broker, mqtt_cfg={"spool": True}).start()
    try:
        fresh = d2.report()["seq"]
        assert fresh > spooled[-1]
        wait_for(lambda: fresh in telemetry_seqs(rec2), what="spool then live telemetry")
        assert telemetry_seqs(rec2) == [*spooled, fresh]
        wait_for(lambda: not (state / "mqtt-spool.jsonl").exists(), timeout=10,
                 what="spool removed once sent")
    finally:
        d2.stop()
        rec2.close()


# ---- events and Home Assistant ---------------------------------------------------------
def test_events_and_home_assistant_discovery(running: Any, broker: Broker) -> None:  # noqa: F811
    d = running(mqtt_cfg={"homeassistant_discovery": True})
    rec = Recorder(broker, [f"{BASE}/events", "homeassistant/#"])
    try:
        d.daemon.events.emit("thermal", zone="cpu-thermal", temp_c=91.0, threshold_c=85.0,
                             state="hot")
        ev = wait_for(lambda: rec.json_on(f"{BASE}/events"), what="event")[0]
        assert ev["type"] == "thermal" and ev["zone"] == "cpu-thermal"
        d.report()
        cfg_topic = "homeassistant/sensor/edgepilot_dev1/cpu_util/config"
        conf = wait_for(lambda: rec.json_on(cfg_topic), what="discovery config")[0]
        assert rec.on(cfg_topic)[0].retain
        assert conf["state_topic"] == f"{BASE}/telemetry"
        assert conf["availability_topic"] == f"{BASE}/status"
        assert conf["unique_id"] == "edgepilot_dev1_cpu_util"
    finally:
        rec.close()


def test_status_refresh_on_profile_event_and_reload_to_new_device_id(
        running: Any, broker: Broker) -> None:  # noqa: F811
    d = running()
    rec = Recorder(broker, [f"{BASE}/status", "edgepilot/dev2/status"])
    try:
        wait_for(lambda: rec.json_on(f"{BASE}/status"), what="first status")
        d.daemon.events.emit("profile.applied", name="powersave")
        wait_for(lambda: len(rec.json_on(f"{BASE}/status")) >= 2, what="status refreshed")
        assert rec.json_on(f"{BASE}/status")[-1]["state"] == "online"
        # SIGHUP with a new [mqtt] device_id: old status goes offline, new one comes online
        old = d.daemon.config
        new = old.model_copy(update={"mqtt": old.mqtt.model_copy(update={"device_id": "dev2"})})
        d.daemon.config = new
        d.lt.run(d.daemon.mqtt.reload(old, new))
        wait_for(lambda: rec.json_on(f"{BASE}/status")[-1]["state"] == "offline",
                 what="old device offline")
        wait_for(lambda: [s for s in rec.json_on("edgepilot/dev2/status")
                          if s["state"] == "online"], what="new device online")
        rep = d.report()
        assert rep["dropped"] == 0 and rep["mqtt_connected"] is True
    finally:
        rec.close()


# ---- TLS ----------------------------------------------------------------------------------
def test_tls_connection_with_ca_file(tmp_path: Path) -> None:
    ca, cert, key = make_test_ca(tmp_path / "pki")
    tls_broker = Broker(tmp_path / "tlsbroker", tls=(ca, cert, key))
    tls_broker.start()
    d = None
    try:
        rec = Recorder(tls_broker, [f"{BASE}/status"])  # plain listener, to watch
        d = InProcessDaemon(tmp_path / "state", tls_broker,
                            mqtt_cfg={"port": tls_broker.tls_port,
                                      "tls": {"ca_file": str(ca)}}).start()
        online = wait_for(lambda: rec.json_on(f"{BASE}/status"), what="online over TLS")
        assert online[-1]["state"] == "online"
        rec.close()
    finally:
        if d is not None:
            d.stop()
        tls_broker.stop()


def test_missing_tls_file_is_a_config_error_naming_the_field(tmp_path: Path,
                                                             broker: Broker) -> None:  # noqa: F811
    d = InProcessDaemon(tmp_path / "state", broker,
                        mqtt_cfg={"tls": {"ca_file": str(tmp_path / "nope.pem")}})
    try:
        with pytest.raises(ConfigError) as exc:
            d.start()
        assert exc.value.field == "mqtt.tls.ca_file"
        assert "nope.pem" in exc.value.message
    finally:
        d.stop()
