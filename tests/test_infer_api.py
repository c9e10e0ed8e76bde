"""``POST /v1/infer/{model}`` on a real daemon against direct onnxruntime / TFLite calls."""

from __future__ import annotations

import io
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from ai_edge_litert.interpreter import Interpreter
from daemon_proc import DaemonProcess
from models_fixtures import (  # noqa: F401 - fixtures
    gguf_path,
    mlp_tflite,
    module_tmp,
    silero_onnx,
    start_daemon,
    wakeword_tflite,
)

from edgepilot.formats.onnx_gen import mlp_stack

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def daemon(module_tmp: Path, gguf_path: Path, mlp_tflite: Path  # noqa: F811
           ) -> Iterator[DaemonProcess]:
    models = module_tmp / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(16, 32, 16), batch=2)
    shutil.copy(mlp_tflite, models / "mlp_tfl.tflite")
    shutil.copy(wakeword_tflite("alexa"), models / "alexa.tflite")
    shutil.copy(silero_onnx(), models / "vad.onnx")
    shutil.copy(gguf_path, models / "chat.gguf")
    shutil.copy(mlp_tflite, module_tmp / "outside.tflite")
    # dispatch off: these tests pin the registry's whole-model path (fp32, exact); plans are
    # the dispatcher's tests
    d = start_daemon(module_tmp, f'[http]\nmax_body_bytes = 65536\ntoken = "{TOKEN}"\n'
                                 "[dispatch]\nenabled = false\n"
                                 '[[models]]\nname = "escaper"\nfile = "../outside.tflite"\n'
                                 "load_at_start = false\n")
    yield d
    assert d.stop() == 0


def as_json(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    return {"inputs": {n: {"data": a.ravel().tolist(), "dtype": str(a.dtype),
                           "shape": list(a.shape)} for n, a in arrays.items()}}


def decode(body: dict[str, Any]) -> dict[str, np.ndarray]:
    return {n: np.asarray(o["data"], dtype=o["dtype"]).reshape(o["shape"])
            for n, o in body["outputs"].items()}


def onnx_direct(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def tflite_direct(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ip = Interpreter(model_path=str(path))
    ip.allocate_tensors()
    for d in ip.get_input_details():
        ip.set_tensor(d["index"], feeds[d["name"]])
    ip.invoke()
    return {d["name"]: ip.get_tensor(d["index"]).copy() for d in ip.get_output_details()}


def check_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_onnx_mlp_equals_onnxruntime(daemon: DaemonProcess, module_tmp: Path) -> None:  # noqa: F811
    x = {"x": np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)}
    code, body = daemon.request("POST", "/v1/infer/mlp", as_json(x))
    assert code == 200, body
    assert body["plan"] == "single:onnxruntime/cpu/fp32" and body["latency_ms"] >= 0
    check_equal(decode(body), onnx_direct(module_tmp / "models" / "mlp.onnx", x))


def test_real_silero_vad_equals_onnxruntime(daemon: DaemonProcess, module_tmp: Path) -> None:  # noqa: F811
    rng = np.random.default_rng(1)
    feeds = {"input": rng.standard_normal((1, 512)).astype(np.float32) * 0.1,
             "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    code, body = daemon.request("POST", "/v1/infer/vad", as_json(feeds))
    assert code == 200, body
    check_equal(decode(body), onnx_direct(module_tmp / "models" / "vad.onnx", feeds))


def test_a_tensor_models_card_says_what_a_request_must_hold(daemon: DaemonProcess,
                                                            module_tmp: Path) -> None:  # noqa: F811
    code, card = daemon.request("GET", "/v1/models/vad")
    assert code == 200, card
    sess = ort.InferenceSession(str(module_tmp / "models" / "vad.onnx"),
                                providers=["CPUExecutionProvider"])
    assert [i["name"] for i in card["inputs"]] == [i.name for i in sess.get_inputs()]
    assert {i["name"]: i["dtype"] for i in card["inputs"]} == \
        {"input": "float32", "state": "float32", "sr": "int64"}
    assert {i["name"]: i["shape"] for i in card["inputs"]}["state"] == [2, "batch", 128]
    assert [o["name"] for o in card["outputs"]] == [o.name for o in sess.get_outputs()]
    code, chat = daemon.request("GET", "/v1/models/chat")
    assert code == 200 and "inputs" not in chat  # a GGUF takes messages, not tensors


@pytest.mark.parametrize("model", ["mlp_tfl", "alexa"])
def test_tflite_equals_the_interpreter(daemon: DaemonProcess, module_tmp: Path,  # noqa: F811
                                       model: str) -> None:
    path = module_tmp / "models" / f"{model}.tflite"
    detail = Interpreter(model_path=str(path)).get_input_details()[0]
    x = {detail["name"]: np.random.default_rng(2).standard_normal(
        detail["shape"]).astype(np.float32)}
    code, body = daemon.request("POST", f"/v1/infer/{model}", as_json(x))
    assert code == 200, body
    assert body["plan"] == "single:tflite/xnnpack/fp32"
    check_equal(decode(body), tflite_direct(path, x))


def test_npy_in_npy_out(daemon: DaemonProcess, module_tmp: Path) -> None:  # noqa: F811
    x = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
    buf = io.BytesIO()
    np.save(buf, x)
    req = urllib.request.Request(daemon.url + "/v1/infer/mlp", data=buf.getvalue(), headers={
        "Content-Type": "application/x-npy", "Accept": "application/x-npy"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        got = np.load(io.BytesIO(resp.read()))
        assert resp.headers["X-Plan"]
        name = resp.headers["X-Output-Name"]
    want = onnx_direct(module_tmp / "models" / "mlp.onnx", {"x": x})[name]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("path", "body", "status", "field", "text"), [
    ("/v1/infer/ghost", {"inputs": {}}, 404, "model", "unknown model 'ghost'"),
    ("/v1/infer/mlp", as_json({"x": np.zeros((2, 16), np.float64)}), 400, "inputs.x.dtype",
     "wants float32"),
    ("/v1/infer/mlp", as_json({"x": np.zeros((2, 15), np.float32)}), 400, "inputs.x.shape",
     "wants [2, 16]"),
    ("/v1/infer/mlp", as_json({"y": np.zeros((2, 16), np.float32)}), 400, "inputs.y",
     "unknown input"),
    ("/v1/infer/mlp", {"inputs": {"x": {"data": [1], "dtype": "complex64"}}}, 400,
     "inputs.x.dtype", "allowed: float32"),
    ("/v1/infer/mlp", {"inputs": {"x": {"data": [1, 2, 3], "shape": [2, 2]}}}, 400,
     "inputs.x.shape", "do not fill"),
    ("/v1/infer/escaper", {"inputs": {}}, 400, "models.escaper.file", "outside the model dir"),
    ("/v1/infer/chat", {"inputs": {}}, 400, "model", "/v1/chat/completions"),
    ("/v1/infer/mlp", as_json({"x": np.zeros((2000, 16), np.float32)}), 413, "body",
     "max_body_bytes"),
])
def test_bad_requests_are_4xx_and_serving_goes_on(
        daemon: DaemonProcess, path: str, body: Any, status: int, field: str,
        text: str) -> None:
    code, reply = daemon.request("POST", path, body)
    assert code == status, reply
    assert reply["error"]["field"] == field
    assert text in reply["error"]["message"]
    ok, _ = daemon.request("POST", "/v1/infer/mlp", as_json({"x": np.ones((2, 16), np.float32)}))
    assert ok == 200


def test_model_commands_need_the_token(daemon: DaemonProcess) -> None:
    code, reply = daemon.request("POST", "/v1/commands/model.unload", {"name": "mlp"})
    assert code == 401 and reply["error"]["field"] == "authorization"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    code, reply = daemon.request("POST", "/v1/commands/model.load", {"name": "alexa"},
                                 headers=auth)
    assert code == 200 and reply["result"]["target"] == "tflite/xnnpack/fp32"
    code, reply = daemon.request("POST", "/v1/commands/model.list", {})
    assert {m["name"]: m["loaded"] for m in reply["result"]["models"]}["alexa"] is True
    code, reply = daemon.request("POST", "/v1/commands/model.unload", {"name": "alexa"},
                                 headers=auth)
    assert code == 200 and reply["result"]["was_loaded"] is True


def test_telemetry_names_the_plan_that_served(daemon: DaemonProcess) -> None:
    x = {"x": np.random.default_rng(5).standard_normal((2, 16)).astype(np.float32)}
    code, body = daemon.request("POST", "/v1/infer/mlp", as_json(x))
    assert code == 200, body
    code, reply = daemon.request("POST", "/v1/commands/telemetry.get", {})
    assert code == 200, reply
    model = reply["result"]["models"]["mlp"]
    assert model["plan"] == body["plan"]
    assert model["requests_total"] >= 1
