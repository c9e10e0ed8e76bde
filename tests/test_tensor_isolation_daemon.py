"""Tensor backends in worker processes under a real daemon over HTTP: a killed worker costs
only its request, the daemon keeps its PID and answers, the fault goes out on MQTT (a real
mosquitto); no worker outlives its daemon."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import isolation_fixtures
import numpy as np
import psutil
import pytest
from daemon_proc import DaemonProcess
from isolation_fixtures import WAIT_S, backends, cmdline, cpu, wait_until
from models_fixtures import module_tmp, start_daemon  # noqa: F401 - fixtures
from mqtt_fixtures import Broker, Recorder

from edgepilot.backends.base import Segment

models = isolation_fixtures.models  # the fixture, shared with test_tensor_isolation


# ---- a real daemon over HTTP ------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemon(module_tmp: Path, models: dict[str, Segment]) -> Iterator[DaemonProcess]:  # noqa: F811
    model_dir = module_tmp / "models"
    model_dir.mkdir()
    shutil.copy(models["onnxruntime"].model_path, model_dir / "mlp.onnx")
    # dispatch off: the registry's whole-model path (a plan's segments compile the same way)
    d = start_daemon(module_tmp, '[backends.onnxruntime]\nisolation = "process"\n'
                                 "[dispatch]\nenabled = false\n")
    yield d
    assert d.stop() == 0


def infer(d: DaemonProcess, x: np.ndarray) -> tuple[int, Any]:
    return d.request("POST", "/v1/infer/mlp", {"inputs": {"x": {
        "data": x.ravel().tolist(), "dtype": "float32", "shape": list(x.shape)}}})


def worker_pid(d: DaemonProcess) -> int | None:
    status, body = d.request("GET", "/v1/models")
    assert status == 200
    entry = next(m for m in body["data"] if m["id"] == "mlp")
    return entry.get("worker_pid")  # type: ignore[no-any-return]


def queued_bytes(pid: int) -> int:
    """Bytes waiting unread in the sockets of ``pid`` (``ss``: the kernel's own count)."""
    out = subprocess.run(["ss", "-xpH"], capture_output=True, text=True, check=True).stdout
    return sum(int(line.split()[2]) for line in out.splitlines()
               if re.search(rf"pid={pid},", line))


def test_killing_the_worker_leaves_the_daemon_serving(daemon: DaemonProcess,
                                                      models: dict[str, Segment]) -> None:
    assert daemon.proc is not None
    daemon_pid = daemon.proc.pid
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    want = backends("onnxruntime", "thread").compile(models["onnxruntime"],
                                                     cpu(models["onnxruntime"])).run({"x": x})
    status, body = infer(daemon, x)
    assert status == 200, body
    np.testing.assert_allclose(body["outputs"]["y"]["data"], want["y"].ravel(), rtol=1e-6)
    pid = worker_pid(daemon)
    assert pid is not None and "edgepilot worker onnxruntime mlp --fd" in cmdline(pid)
    assert psutil.Process(pid).ppid() == daemon_pid

    # killed during a request: that request is answered with the fault, named
    os.kill(pid, signal.SIGSTOP)
    answer: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: answer.update(r=infer(daemon, x)))
    thread.start()
    wait_until(lambda: queued_bytes(pid) > 0, "the request reached the worker's socket")
    os.kill(pid, signal.SIGKILL)
    thread.join(WAIT_S)
    status, body = answer["r"]
    assert status == 503 and body["error"]["code"] == "worker_crashed", body
    assert "SIGKILL" in body["error"]["message"]

    # the daemon is the same process and keeps answering, on a restarted worker
    assert daemon.proc.poll() is None and daemon.proc.pid == daemon_pid
    status, body = infer(daemon, x)
    assert status == 200, body
    np.testing.assert_allclose(body["outputs"]["y"]["data"], want["y"].ravel(), rtol=1e-6)
    new = worker_pid(daemon)
    assert new not in (None, pid) and psutil.Process(new).ppid() == daemon_pid

    # killed between requests: no request is lost
    os.kill(new, signal.SIGKILL)
    wait_until(lambda: f"worker for model mlp (pid {new}) was killed by signal 9 (SIGKILL"
               in daemon.output(), "the daemon logged its worker's death")
    status, body = infer(daemon, x)
    assert status == 200, body
    assert worker_pid(daemon) not in (None, pid, new)




def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_no_tensor_worker_outlives_a_killed_daemon(tmp_path: Path,
                                                   models: dict[str, Segment]) -> None:
    (tmp_path / "models").mkdir()
    shutil.copy(models["tflite"].model_path, tmp_path / "models" / "tfl.tflite")
    d = start_daemon(tmp_path, '[backends.tflite]\nisolation = "process"\n'
                               "[dispatch]\nenabled = false\n")
    try:
        x = np.zeros((2, 32), np.float32)
        status, body = d.request("POST", "/v1/infer/tfl", {"inputs": {"input": {
            "data": x.ravel().tolist(), "dtype": "float32", "shape": [2, 32]}}})
        assert status == 200, body
        body = d.request("GET", "/v1/models")[1]
        pid = next(m for m in body["data"] if m["id"] == "tfl")["worker_pid"]
        assert "edgepilot worker tflite tfl --fd" in cmdline(pid)
    finally:
        d.stop(signal.SIGKILL)
    # the kernel closed the daemon's end of the socket: the worker sees EOF and leaves
    wait_until(lambda: gone(pid), "the worker left with its daemon")


def test_a_worker_fault_goes_out_on_mqtt(tmp_path: Path, models: dict[str, Segment]) -> None:
    (tmp_path / "models").mkdir()
    shutil.copy(models["onnxruntime"].model_path, tmp_path / "models" / "mlp.onnx")
    (tmp_path / "d").mkdir()
    broker = Broker(tmp_path / "broker")
    broker.start()
    d = DaemonProcess(tmp_path / "d", f"""
[daemon]
demo_models = false
[mqtt]
host = "{broker.host}"
port = {broker.port}
device_id = "iso"
[backends.onnxruntime]
isolation = "process"
[dispatch]
enabled = false
""", extra_args=["--model-dir", str(tmp_path / "models")])
    rec: Recorder | None = None
    try:
        d.start()
        rec = Recorder(broker, ["edgepilot/iso/events"])
        x = np.zeros((2, 64), np.float32)
        assert infer(d, x)[0] == 200
        pid = worker_pid(d)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

        def fault() -> dict[str, Any] | None:
            assert rec is not None
            return next((e for e in rec.json_on("edgepilot/iso/events")
                         if e.get("type") == "backend.fault"), None)

        event = wait_until(fault, "backend.fault on MQTT")
        assert event["model"] == "mlp" and event["target"] == "onnxruntime/cpu/fp32"
        assert event["pid"] == pid and "SIGKILL" in event["message"]
        assert infer(d, x)[0] == 200  # and the model is served again
    finally:
        if rec is not None:
            rec.close()
        d.stop()
        broker.stop()
