"""Config reload (SIGHUP) on a real daemon subprocess: removed and changed models are unloaded.

The daemon publishes its events to a real mosquitto started by the test; the test edits the
config file, sends SIGHUP and watches ``/v1/models`` and the ``events`` topic.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProcess
from models_fixtures import gguf_path, mlp_tflite  # noqa: F401 - fixtures
from mqtt_fixtures import Broker, Recorder, broker, wait_for  # noqa: F401 - fixture

from edgepilot.formats.onnx_gen import mlp_stack

DEVICE = "reloadbox"
MODELS = ('[[models]]\nname = "chat"\nfile = "tiny.gguf"\n'
          '[[models]]\nname = "mlp"\nfile = "mlp.tflite"\n'
          '[[models]]\nname = "net"\nfile = "net.tflite"\n')
CLAIM = '[[models]]\nname = "chat2"\nfile = "tiny.gguf"\nload_at_start = false\n'
# "chat" removed, "net" changed, "mlp" as it was
RELOADED = ('[[models]]\nname = "mlp"\nfile = "mlp.tflite"\n'
            '[[models]]\nname = "net"\nfile = "net.tflite"\nkeep_alive_s = 60\n')


def _config(b: Broker, models: str) -> str:
    return (f'[mqtt]\nhost = "{b.host}"\nport = {b.port}\ndevice_id = "{DEVICE}"\n'
            "[backends.llamacpp]\nn_ctx = 128\n" + models)


def _models(d: DaemonProcess) -> dict[str, dict[str, Any]]:
    code, body = d.request("GET", "/v1/models")
    assert code == 200, body
    return {m["id"]: m for m in body["data"]}


def test_sighup_unloads_models_removed_from_config(tmp_path: Path, broker: Broker,  # noqa: F811
                                                   gguf_path: Path,  # noqa: F811
                                                   mlp_tflite: Path) -> None:  # noqa: F811
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(gguf_path, models / "tiny.gguf")
    shutil.copy(mlp_tflite, models / "mlp.tflite")
    shutil.copy(mlp_tflite, models / "net.tflite")
    events_topic = f"edgepilot/{DEVICE}/events"
    rec = Recorder(broker, [events_topic])
    d = DaemonProcess(tmp_path, _config(broker, MODELS),
                      extra_args=["--model-dir", str(models)])
    d.start()
    try:
        d.wait_for("/readyz", timeout=120)
        before = _models(d)
        assert {n for n, m in before.items() if m["loaded"]} == {"chat", "mlp", "net"}

        assert d.config_path is not None
        d.config_path.write_text(_config(broker, RELOADED))
        d.send_signal(signal.SIGHUP)

        def unloaded() -> dict[str, str]:
            return {e["model"]: e["reason"] for e in rec.json_on(events_topic)
                    if e.get("type") == "model.unloaded"}

        wait_for(lambda: len(unloaded()) >= 2, timeout=30, what="model.unloaded events")
        wait_for(lambda: any(e.get("type") == "config.reloaded"
                             for e in rec.json_on(events_topic)), what="config.reloaded")
        assert unloaded() == {"chat": "removed from config", "net": "config changed"}
        after = _models(d)
        # "chat" is gone; its file is now a dropped-in model named by its stem, not loaded
        assert "chat" not in after
        assert after["tiny"]["loaded"] is False
        assert after["mlp"]["loaded"] is True  # unchanged entries stay resident
        assert after["net"]["loaded"] is False  # changed ones reload on their next request
        code, body = d.request("POST", "/v1/chat/completions", {
            "model": "chat", "messages": [{"role": "user", "content": "hi"}]})
        assert code == 404 and "chat" in body["error"]["message"]
        code, _ = d.request("POST", "/v1/commands/model.load", {"name": "net"})
        assert code == 200 and _models(d)["net"]["loaded"] is True

        # a loaded dropped-in model whose file an entry now claims under another name is gone too
        code, _ = d.request("POST", "/v1/commands/model.load", {"name": "tiny"})
        assert code == 200 and _models(d)["tiny"]["loaded"] is True
        d.config_path.write_text(_config(broker, RELOADED + CLAIM))
        d.send_signal(signal.SIGHUP)
        wait_for(lambda: "tiny" in unloaded(), timeout=30, what="tiny unloaded")
        assert unloaded()["tiny"] == "removed from config"
        after = _models(d)
        assert "tiny" not in after and after["chat2"]["loaded"] is False
        assert after["mlp"]["loaded"] is True and after["net"]["loaded"] is True
    finally:
        rec.close()
        assert d.stop() == 0, d.output()


def test_readyz_names_a_configured_model_that_failed_to_load(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "m.onnx", widths=(8, 16, 8))
    digest = hashlib.sha256((models / "m.onnx").read_bytes()).hexdigest()
    wrong = "0" * 64
    cfg = ("[mqtt]\nenabled = false\n[daemon]\n"
           f'model_dir = "{models}"\n[[models]]\nname = "m"\nfile = "m.onnx"\n'
           f'sha256 = "{wrong}"\n')
    d = DaemonProcess(tmp_path, cfg).start()
    try:
        deadline = time.monotonic() + 60
        body = d.wait_for("/readyz", 503, timeout=60)
        while "failed" not in body["reasons"].get("models", "") and time.monotonic() < deadline:
            time.sleep(0.1)  # 503 "loading models" comes first, while start-up runs
            body = d.wait_for("/readyz", 503, timeout=60)
        assert "model 'm' failed to load" in body["reasons"]["models"]
        assert "sha256" in body["reasons"]["models"]
        assert d.request("GET", "/healthz")[0] == 200
        # fix the config and reload: the model gets another chance and /readyz turns 200
        assert d.config_path is not None
        d.config_path.write_text(cfg.replace(wrong, digest))
        d.send_signal(signal.SIGHUP)
        d.wait_for("/readyz", 200, timeout=60)
        code, reply = d.request("POST", "/v1/commands/model.load", {"name": "m"})
        assert code == 200, reply
    finally:
        assert d.stop() == 0
