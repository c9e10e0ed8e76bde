"""The README's run command: the embedded default serves demo models with no board or broker."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from daemon_proc import DaemonProcess, free_port
from prometheus_client.parser import text_string_to_metric_families


def test_embedded_default_serves_demo_models_without_a_broker(tmp_path: Path) -> None:
    # Only the broker port differs from the embedded default, so that this test never talks to
    # a broker someone else runs on 1883: nothing listens on this port.
    closed = free_port()
    d = DaemonProcess(tmp_path, f"[mqtt]\nport = {closed}\n").start()
    try:
        body = d.wait_for("/readyz", 200, timeout=120)
        assert body["status"] == "ready"
        deadline = time.monotonic() + 60
        while body["targets"].get("*") == "probing" and time.monotonic() < deadline:
            time.sleep(0.2)  # each target's tiny probe runs once, in the background
            body = d.wait_for("/readyz", 200, timeout=60)
        # what the embedded default serves with passed its probe
        assert body["targets"]["onnxruntime/cpu/fp32"] == "PASS"
        assert body["targets"]["llamacpp/cpu/native"] == "PASS"
        models = {m["id"]: m for m in d.request("GET", "/v1/models")[1]["data"]}
        assert {"demo-chat", "demo-mlp"} <= set(models)
        assert (d.state_dir / "models" / "demo-chat.gguf").stat().st_size > 0
        code, reply = d.request("POST", "/v1/chat/completions", {
            "model": "demo-chat", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hello"}]})
        assert code == 200, reply
        assert reply["usage"]["completion_tokens"] >= 1
        status = d.request("POST", "/v1/commands/status", {})[1]["result"]
        assert status["board"]["family"] == "generic"
        code, text = d.request("GET", "/metrics")
        families = {f.name for f in text_string_to_metric_families(text)}
        assert "edgepilot_up" in families
        # the broker is away: the daemon serves anyway and keeps retrying in the background
        assert "nothing accepts connections there; retrying" in d.output()
        t0 = time.monotonic()
        assert d.stop(signal.SIGTERM, timeout=10) == 0
        assert time.monotonic() - t0 < 10
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
