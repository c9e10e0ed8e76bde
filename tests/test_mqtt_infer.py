"""MQTT ``infer``: a daemon subprocess, a real mosquitto, a real ONNX model in onnxruntime.

JSON from the ``mosquitto_pub -V mqttv5`` CLI (response topic + correlation data), ``.npz``
from a paho MQTT 5 client, JSON from a 3.1.1 client with ``reply_to``, the same verb over
``POST /v1/commands/infer``; and an error reply naming the field for an oversize payload, an
unknown model, a GGUF model, a bad dtype and bad shapes.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import paho.mqtt.client as mqtt
import pytest
from daemon_proc import DaemonProcess
from models_fixtures import gguf_path  # noqa: F401
from mqtt_fixtures import Broker, Recorder, wait_for
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgepilot.formats.onnx_gen import mlp_stack

BASE = "edgepilot/mq"
LIMIT = 64 * 1024
NPZ = "application/x-npz"


class Setup:
    def __init__(self, broker: Broker, daemon: DaemonProcess, rec: Recorder, model: Path) -> None:
        self.broker = broker
        self.daemon = daemon
        self.rec = rec
        self.model = model


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, gguf_path: Path  # noqa: F811
        ) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("mqtt_infer")
    models = tmp / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(16, 32, 8), batch=2)
    shutil.copy(gguf_path, models / "tiny.gguf")
    broker = Broker(tmp / "broker")
    broker.start()
    config = f"""
[daemon]
demo_models = false
[mqtt]
host = "{broker.host}"
port = {broker.port}
device_id = "mq"
max_payload_bytes = {LIMIT}
reconnect_min_s = 0.05
reconnect_max_s = 0.5
"""
    work = tmp / "d"
    work.mkdir()
    daemon = DaemonProcess(work, config, extra_args=["--model-dir", str(models)])
    rec: Recorder | None = None
    try:
        daemon.start()
        rec = Recorder(broker, ["cli/#", f"{BASE}/reply/#", f"{BASE}/status"])
        wait_for(lambda: any(json.loads(m.payload).get("state") == "online"
                             for m in rec.on(f"{BASE}/status")),  # type: ignore[union-attr]
                 timeout=60, what="daemon online on MQTT")
        yield Setup(broker, daemon, rec, models / "mlp.onnx")
    finally:
        if rec is not None:
            rec.close()
        daemon.stop()
        broker.stop()


def reference(model: Path, x: np.ndarray) -> np.ndarray:
    """The same model run by onnxruntime directly."""
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out: np.ndarray = sess.run(["y"], {"x": x})[0]
    return out


def sample(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 16)).astype(np.float32)


def json_request(x: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {"model": "mlp", "inputs": {"x": {"data": x.ravel().tolist(), "dtype": "float32",
                                             "shape": list(x.shape)}}, **extra}


def mosquitto_pub(env: Setup, payload: str, response_topic: str, correlation: str,
                  tmp: Path) -> None:
    # -f: a tensor payload can be longer than a command line comfortably carries
    body = tmp / f"{correlation}.json"
    body.write_text(payload)
    subprocess.run(["mosquitto_pub", "-V", "mqttv5", "-h", env.broker.host,
                    "-p", str(env.broker.port), "-q", "1", "-t", f"{BASE}/cmd/infer",
                    "-f", str(body), "-D", "PUBLISH", "response-topic", response_topic,
                    "-D", "PUBLISH", "correlation-data", correlation],
                   check=True, timeout=30, capture_output=True)


def paho_publish(env: Setup, payload: bytes, props: Properties | None, *,
                 v5: bool = True) -> None:
    protocol = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=protocol)
    c.connect(env.broker.host, env.broker.port)
    c.loop_start()
    try:
        c.publish(f"{BASE}/cmd/infer", payload, qos=1, properties=props).wait_for_publish(10)
    finally:
        c.disconnect()
        c.loop_stop()


def npz_props(response_topic: str, correlation: bytes, **user: str) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = response_topic
    props.CorrelationData = correlation
    props.ContentType = NPZ
    props.UserProperty = list(user.items())
    return props


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def reply(env: Setup, topic: str) -> mqtt.MQTTMessage:
    msg: mqtt.MQTTMessage = wait_for(lambda: env.rec.on(topic), timeout=60, what=topic)[0]
    return msg


def error_of(env: Setup, topic: str) -> dict[str, Any]:
    body = json.loads(reply(env, topic).payload)
    assert body["ok"] is False, body
    err: dict[str, Any] = body["error"]
    return err


def test_json_from_mosquitto_pub_v5(env: Setup, tmp_path: Path) -> None:
    x = sample(1)
    mosquitto_pub(env, json.dumps(json_request(x, timeout_ms=30000)), "cli/json", "corr-j",
                  tmp_path)
    msg = reply(env, "cli/json")
    assert msg.properties.CorrelationData == b"corr-j"
    assert msg.properties.ContentType == "application/json"
    body = json.loads(msg.payload)
    assert body["ok"] is True, body
    result = body["result"]
    y = result["outputs"]["y"]
    assert y["dtype"] == "float32" and y["shape"] == [2, 8]
    got = np.asarray(y["data"], dtype=np.float32).reshape(y["shape"])
    np.testing.assert_allclose(got, reference(env.model, x), rtol=1e-5, atol=1e-5)
    assert isinstance(result["plan"], str) and result["plan"]
    assert result["latency_ms"] > 0 and "energy_j" in result


def test_npz_from_paho_gets_npz_back(env: Setup) -> None:
    x = sample(2)
    paho_publish(env, npz_bytes(x=x), npz_props("cli/npz", b"\x00npz", model="mlp",
                                                timeout_ms="30000"))
    msg = reply(env, "cli/npz")
    assert msg.properties.ContentType == NPZ, msg.payload[:200]
    assert msg.properties.CorrelationData == b"\x00npz"
    meta = dict(msg.properties.UserProperty)
    assert meta["plan"] and float(meta["latency_ms"]) > 0 and "energy_j" in meta
    with np.load(io.BytesIO(msg.payload), allow_pickle=False) as archive:
        assert archive.files == ["y"]
        got = archive["y"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference(env.model, x), rtol=1e-5, atol=1e-5)


def test_311_client_with_reply_to(env: Setup) -> None:
    x = sample(3)
    topic = f"{BASE}/reply/c311"
    body = json_request(x, reply_to=topic, id="r-311")
    paho_publish(env, json.dumps(body).encode(), None, v5=False)
    got = json.loads(reply(env, topic).payload)
    assert got["ok"] is True and got["id"] == "r-311", got
    y = got["result"]["outputs"]["y"]
    np.testing.assert_allclose(np.asarray(y["data"], np.float32).reshape(y["shape"]),
                               reference(env.model, x), rtol=1e-5, atol=1e-5)


def test_same_verb_over_http(env: Setup) -> None:
    x = sample(4)
    code, body = env.daemon.request("POST", "/v1/commands/infer", json_request(x))
    assert code == 200 and body["ok"] is True, body
    y = body["result"]["outputs"]["y"]
    np.testing.assert_allclose(np.asarray(y["data"], np.float32).reshape(y["shape"]),
                               reference(env.model, x), rtol=1e-5, atol=1e-5)


BAD_JSON = [
    ("unknown-model", {"model": "nope", "inputs": {}}, "not_found", "model"),
    ("gguf", {"model": "tiny", "inputs": {}}, "bad_request", "model"),
    ("dtype", {"model": "mlp", "inputs": {"x": {"data": [1], "dtype": "complex64"}}},
     "bad_request", "inputs.x.dtype"),
    ("bool-shape", {"model": "mlp", "inputs": {"x": {"data": [1, 2], "shape": [True, 2]}}},
     "bad_request", "inputs.x.shape"),
    ("wrapping-shape", {"model": "mlp",
                        "inputs": {"x": {"data": [], "shape": [4294967296, 4294967296]}}},
     "bad_request", "inputs.x.shape"),
    ("model-shape", {"model": "mlp", "inputs": {"x": {"data": [0.0] * 16, "shape": [1, 16]}}},
     "bad_request", "inputs.x"),
    ("timeout", {"model": "mlp", "inputs": {}, "timeout_ms": -1}, "bad_request", "timeout_ms"),
]


@pytest.mark.parametrize(("case", "payload", "code", "field"), BAD_JSON,
                         ids=[c[0] for c in BAD_JSON])
def test_bad_json_requests_name_the_field(env: Setup, tmp_path: Path, case: str,
                                          payload: dict[str, Any], code: str,
                                          field: str) -> None:
    mosquitto_pub(env, json.dumps(payload), f"cli/bad-{case}", f"bad-{case}", tmp_path)
    err = error_of(env, f"cli/bad-{case}")
    assert err["code"] == code and (err["field"] or "").startswith(field), err


def test_oversize_payloads_are_answered_naming_the_key(env: Setup, tmp_path: Path) -> None:
    big = np.zeros((2, LIMIT // 8), np.float32)
    mosquitto_pub(env, json.dumps(json_request(big)), "cli/big-json", "big-j", tmp_path)
    paho_publish(env, npz_bytes(x=big), npz_props("cli/big-npz", b"big-n", model="mlp"))
    for topic in ("cli/big-json", "cli/big-npz"):
        err = error_of(env, topic)
        assert err["field"] == "payload" and "[mqtt] max_payload_bytes" in err["message"], err


def test_bad_npz_requests_name_the_field(env: Setup) -> None:
    x = sample(5)
    cases: list[tuple[str, bytes, dict[str, str], str]] = [
        ("no-model", npz_bytes(x=x), {}, "model"),
        ("gguf", npz_bytes(x=x), {"model": "tiny"}, "model"),
        ("not-npz", b"not an archive", {"model": "mlp"}, "payload"),
        ("dtype", npz_bytes(x=x.astype(np.complex64)), {"model": "mlp"}, "inputs.x.dtype"),
        ("timeout", npz_bytes(x=x), {"model": "mlp", "timeout_ms": "soon"}, "timeout_ms"),
    ]
    for case, payload, user, _ in cases:
        paho_publish(env, payload, npz_props(f"cli/npz-{case}", case.encode(), **user))
    for case, _, _, field in cases:
        msg = reply(env, f"cli/npz-{case}")
        assert msg.properties.ContentType == "application/json"
        assert msg.properties.CorrelationData == case.encode()
        err = json.loads(msg.payload)["error"]
        assert err["field"] == field, (case, err)
