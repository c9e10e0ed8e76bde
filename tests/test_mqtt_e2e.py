"""The whole daemon as a subprocess on a fake Orin, against a real mosquitto.

Retained status online / offline (last will on SIGKILL, clean offline on SIGTERM), a
``mosquitto_pub -V mqttv5`` command with response topic and correlation data, the same via
paho, malformed commands, telemetry seq strictly increasing across a crash and a restart,
``GET /v1/telemetry`` and ``/metrics``.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from board_fixtures import FakeBoard, build_tree
from daemon_proc import DaemonProcess
from mqtt_fixtures import Broker, Recorder, broker, wait_for  # noqa: F401
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client.parser import text_string_to_metric_families

BASE = "edgepilot/e2e"


def config_for(brk: Broker) -> str:
    return f"""
[daemon]
demo_models = false
[telemetry]
sample_interval_s = 0.1
publish_interval_s = 0.3
[mqtt]
host = "{brk.host}"
port = {brk.port}
device_id = "e2e"
reconnect_min_s = 0.05
reconnect_max_s = 0.5
"""


@pytest.fixture
def orin_root(tmp_path: Path) -> Iterator[FakeBoard]:
    fake = build_tree(tmp_path / "root", "orin")
    yield fake
    fake.close()


def statuses(rec: Recorder) -> list[dict[str, object]]:
    return rec.json_on(f"{BASE}/status")


def seqs(rec: Recorder) -> list[int]:
    return [m["seq"] for m in rec.json_on(f"{BASE}/telemetry")]


def mosquitto_pub(brk: Broker, verb: str, payload: str, response_topic: str,
                  correlation: str) -> None:
    subprocess.run(["mosquitto_pub", "-V", "mqttv5", "-h", brk.host, "-p", str(brk.port),
                    "-q", "1", "-t", f"{BASE}/cmd/{verb}", "-m", payload,
                    "-D", "PUBLISH", "response-topic", response_topic,
                    "-D", "PUBLISH", "correlation-data", correlation],
                   check=True, timeout=30, capture_output=True)


def test_daemon_over_mqtt_end_to_end(tmp_path: Path, broker: Broker,  # noqa: F811
                                     orin_root: FakeBoard) -> None:
    work = tmp_path / "d"
    work.mkdir()
    args = ["--sysfs-root", str(orin_root.root)]
    d = DaemonProcess(work, config_for(broker), extra_args=args)
    rec = Recorder(broker, [f"{BASE}/status", f"{BASE}/telemetry", "cli/#"])
    d2: DaemonProcess | None = None
    try:
        d.start()
        wait_for(lambda: any(s["state"] == "online" for s in statuses(rec)), timeout=60,
                 what="status online")
        online = [s for s in statuses(rec) if s["state"] == "online"][-1]
        assert online["device_id"] == "e2e" and "version" in online and "board" in online

        # a newcomer gets the status as a retained message
        late = Recorder(broker, [f"{BASE}/status"])
        try:
            wait_for(lambda: late.on(f"{BASE}/status"), what="retained status")
            assert late.on(f"{BASE}/status")[0].retain
        finally:
            late.close()

        # telemetry: seq strictly increasing, power from the fake Orin's INA3221
        wait_for(lambda: len(seqs(rec)) >= 4, what="telemetry")
        got = seqs(rec)
        assert all(b > a for a, b in pairwise(got)), got
        tele = rec.json_on(f"{BASE}/telemetry")[-1]
        assert tele["power_w"] > 0 and tele["rails_w"]["VDD_IN"] > 0
        assert tele["energy_j"] > 0 and "ts" in tele and tele["dropped"] == 0

        # mosquitto_pub -V mqttv5 with response topic and correlation data
        mosquitto_pub(broker, "status", "{}", "cli/one", "corr-1")
        reply = wait_for(lambda: rec.on("cli/one"), what="reply to mosquitto_pub")[0]
        assert reply.properties.CorrelationData == b"corr-1"
        body = json.loads(reply.payload)
        assert body["ok"] is True and body["result"]["version"] == online["version"]

        # the same via paho, with telemetry.get
        c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        c.connect(broker.host, broker.port)
        c.loop_start()
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = "cli/two"
        props.CorrelationData = b"\x00\x01binary"
        c.publish(f"{BASE}/cmd/telemetry.get", b"", qos=1, properties=props).wait_for_publish(10)
        c.disconnect()
        c.loop_stop()
        reply = wait_for(lambda: rec.on("cli/two"), what="reply to paho")[0]
        assert reply.properties.CorrelationData == b"\x00\x01binary"
        assert json.loads(reply.payload)["result"]["power_w"] > 0

        # malformed: error replies, and the daemon keeps publishing
        mosquitto_pub(broker, "status", "{oops", "cli/bad1", "b1")
        mosquitto_pub(broker, "does.not.exist", "{}", "cli/bad2", "b2")
        mosquitto_pub(broker, "telemetry.get", '{"x": 1}', "cli/bad3", "b3")
        for topic, code in (("cli/bad1", "bad_request"), ("cli/bad2", "not_found"),
                            ("cli/bad3", "bad_request")):
            err = wait_for(lambda t=topic: rec.json_on(t), what=topic)[0]
            assert err["ok"] is False and err["error"]["code"] == code
        n = len(seqs(rec))
        wait_for(lambda: len(seqs(rec)) >= n + 2, what="telemetry after bad commands")

        # HTTP views of the same telemetry
        code, snap = d.request("GET", "/v1/telemetry")
        assert code == 200 and snap["power_w"] > 0 and snap["seq"] >= seqs(rec)[0]
        code, text = d.request("GET", "/metrics")
        names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
        assert {"edgepilot_power_watts", "edgepilot_energy_joules_total",
                "edgepilot_telemetry_reports_total"} <= names

        # SIGKILL: the broker publishes the retained last will
        last_seq = seqs(rec)[-1]
        d.stop(signal.SIGKILL)
        will = wait_for(lambda: [s for s in statuses(rec) if s["state"] == "offline"],
                        what="last will")[-1]
        assert will["reason"] == "connection lost"

        # restart on the same state dir: seq continues above everything seen, online again
        n_status = len(statuses(rec))
        d2 = DaemonProcess(work, config_for(broker), extra_args=args)
        d2.start()
        wait_for(lambda: any(s["state"] == "online" for s in statuses(rec)[n_status:]),
                 timeout=60, what="online after restart")
        wait_for(lambda: seqs(rec)[-1] > last_seq, what="telemetry after restart")
        got = seqs(rec)
        assert all(b > a for a, b in pairwise(got)), got

        # SIGTERM: a clean offline, exit 0
        assert d2.stop(signal.SIGTERM) == 0
        wait_for(lambda: statuses(rec)[-1]["state"] == "offline", what="clean offline")
        assert statuses(rec)[-1]["reason"] == "stopped"
    finally:
        rec.close()
        for proc in (d, d2):
            if proc is not None and proc.proc is not None and proc.proc.poll() is None:
                proc.proc.kill()
                proc.proc.wait()
