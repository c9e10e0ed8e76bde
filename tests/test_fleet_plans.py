"""Plans shared between identical boards over one real mosquitto.

Three daemons as subprocesses: two on fake trees of the same board (Orin NX), one on another
kind (Raspberry Pi 5). The first plans two models and publishes them retained; before the second
starts, bad retained messages are put under its fingerprint (not JSON, a wrong sha256, a plan
naming a target the board lacks). The second adopts the good plan (``plan.adopted`` with its
timing), serves through it, ignores each bad message with one ``plan.rejected`` event and plans
the model whose published plan it refused itself; the third, another board kind, adopts
nothing.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from board_fixtures import FakeBoard, build_tree
from daemon_proc import DaemonProcess
from mqtt_fixtures import Broker, Recorder, broker, wait_for  # noqa: F401
from paho.mqtt.enums import CallbackAPIVersion
from plan_reasons import planned_here

from edgepilot.formats.onnx_gen import mlp_stack

PLANS = "edgepilot/fleet/plans"


def config(brk: Broker, device: str, models: Path) -> str:
    # verify_tolerance: this test checks which plan is adopted, not this shared 2-core
    # machine's timing noise between three daemons (test_fleet_exchange.py checks the bound)
    return f"""
[daemon]
demo_models = false
model_dir = "{models}"
[telemetry]
sample_interval_s = 0.5
publish_interval_s = 3600
[mqtt]
host = "{brk.host}"
port = {brk.port}
device_id = "{device}"
reconnect_min_s = 0.05
reconnect_max_s = 0.5
[dispatch]
kernel_corpus = false
profile_runs = 3
[fleet]
verify_tolerance = 50
"""


@pytest.fixture
def trees(tmp_path: Path) -> Iterator[dict[str, FakeBoard]]:
    made = {"a": build_tree(tmp_path / "root-a", "orin"),
            "b": build_tree(tmp_path / "root-b", "orin"),
            "c": build_tree(tmp_path / "root-c", "rpi5")}
    yield made
    for fake in made.values():
        fake.close()


def start(tmp: Path, brk: Broker, device: str, models: Path, root: FakeBoard,
          rec: Recorder) -> tuple[DaemonProcess, str]:
    work = tmp / device
    work.mkdir()
    d = DaemonProcess(work, config(brk, device, models),
                      extra_args=["--sysfs-root", str(root.root)]).start()
    # the retained status names the fingerprint once the daemon subscribed to its plans
    status = wait_for(lambda: next((s for s in reversed(rec.json_on(f"edgepilot/{device}/status"))
                                    if (s.get("fleet") or {}).get("fingerprint")), None),
                      timeout=60, what=f"{device}'s status with its fingerprint")
    return d, status["fleet"]["fingerprint"]




def events(rec: Recorder, device: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in rec.json_on(f"edgepilot/{device}/events") if e["type"] == kind]


def plan(d: DaemonProcess, model: str) -> dict[str, Any]:
    """The plan of ``model`` once made (202 while it is planned in the background)."""
    def made() -> dict[str, Any] | None:
        code, body = d.request("GET", f"/v1/plan/{model}")
        assert code in (200, 202), body
        return body if code == 200 else None
    result: dict[str, Any] = wait_for(made, timeout=180, interval=0.2, what=f"{model}'s plan")
    return result


def retained(brk: Broker, topic: str, payload: bytes) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect(brk.host, brk.port)
    client.loop_start()
    client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
    client.disconnect()
    client.loop_stop()


def test_identical_boards_share_plans(tmp_path: Path, broker: Broker,  # noqa: F811
                                      trees: dict[str, FakeBoard]) -> None:
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(32, 64, 64, 32), batch=2)
    mlp_stack(models / "wide.onnx", widths=(32, 96, 96, 32), batch=2)
    rec = Recorder(broker, ["edgepilot/+/events", "edgepilot/+/status", f"{PLANS}/#"])
    started: list[DaemonProcess] = []
    try:
        a, fp_a = start(tmp_path, broker, "a", models, trees["a"], rec)
        started.append(a)
        plans_a = {m: plan(a, m) for m in ("mlp", "wide")}
        published = wait_for(lambda: len(events(rec, "a", "plan.published")) == 2 and [
            m for m in rec.messages if m.topic.startswith(f"{PLANS}/{fp_a}/")],
            what="a's two plans published")
        docs = {json.loads(m.payload)["model"]: (m.topic, json.loads(m.payload))
                for m in published}
        mlp_topic, mlp_doc = docs["mlp"]
        assert mlp_doc["fingerprint"] == fp_a and mlp_doc["device_id"] == "a"
        assert mlp_doc["planning_s"] > 0 and mlp_doc["segment_ms"]

        # bad retained messages under the fingerprint the next board of this kind reads
        bad_target = copy.deepcopy(mlp_doc)
        bad_target["plan"]["segments"][0]["target"] = "armnn/npu/int8"
        retained(broker, mlp_topic, json.dumps(bad_target).encode())
        wrong_sha = copy.deepcopy(mlp_doc)
        other_sha = "f" * 64
        retained(broker, f"{PLANS}/{fp_a}/{other_sha}/{mlp_doc['signature']}",
                 json.dumps(wrong_sha).encode())
        retained(broker, f"{PLANS}/{fp_a}/{'0' * 64}/x", b"{not json")

        b, fp_b = start(tmp_path, broker, "b", models, trees["b"], rec)
        started.append(b)
        assert fp_b == fp_a
        wide_b, mlp_b = plan(b, "wide"), plan(b, "mlp")
        adopted = wait_for(lambda: events(rec, "b", "plan.adopted"), what="b adopts")
        assert [e["model"] for e in adopted] == ["wide"]
        assert adopted[0]["source"] == "a" and adopted[0]["planning_s"] > 0
        assert adopted[0]["adopt_s"] > 0 and adopted[0]["ratio"] is not None
        assert wide_b["reason"] == "fleet" and wide_b["from_cache"]
        assert wide_b["segments"] == plans_a["wide"]["segments"]
        # the refused plan was planned here instead
        assert planned_here(mlp_b["reason"]) and not mlp_b["from_cache"]
        rejected = wait_for(lambda: (lambda r: r if len(r) >= 3 else None)(
            events(rec, "b", "plan.rejected")), what="b's three rejections")
        reasons = sorted(e["reason"].split(":")[0].split(" ")[0] for e in rejected)
        assert len(rejected) == 3, rejected
        assert reasons == ["model_sha256", "names", "not"], rejected
        assert "armnn/npu/int8" in next(e["reason"] for e in rejected
                                        if e["reason"].startswith("names"))
        # b serves through the adopted plan
        x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
        code, body = b.request("POST", "/v1/infer/wide", {"inputs": {"x": {
            "data": x.ravel().tolist(), "dtype": "float32", "shape": [2, 32]}}})
        assert code == 200 and body["plan"] == wide_b["hash"], body

        c, fp_c = start(tmp_path, broker, "c", models, trees["c"], rec)
        started.append(c)
        assert fp_c != fp_a
        wide_c = plan(c, "wide")
        assert planned_here(wide_c["reason"]) and not events(rec, "c", "plan.adopted")
        wait_for(lambda: events(rec, "c", "plan.published"), what="c publishes its own")
        assert not events(rec, "c", "plan.rejected")  # it never saw the Orin's plans
    finally:
        for d in started:
            assert d.stop() == 0, d.output()[-3000:]
        rec.close()
