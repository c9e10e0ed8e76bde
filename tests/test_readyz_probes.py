"""``/readyz`` reports each backend target's tiny probe (doctor's), run once at start."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProcess

from edgepilot.backends import load_backend
from edgepilot.backends.base import Backend
from edgepilot.config import parse_config
from edgepilot.serving.probes import run_selftests


def probed(d: DaemonProcess, status: int) -> dict[str, Any]:
    deadline = time.monotonic() + 90
    body = d.wait_for("/readyz", status, timeout=90)
    while body["targets"].get("*") == "probing" and time.monotonic() < deadline:
        time.sleep(0.2)
        body = d.wait_for("/readyz", status, timeout=90)
    return body


def test_readyz_lists_the_enabled_backends_targets_and_their_probes(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, '[mqtt]\nenabled = false\n[backends]\n'
                                'enabled = ["onnxruntime", "tflite"]\n').start()
    try:
        body = probed(d, 200)
    finally:
        assert d.stop() == 0
    targets = body["targets"]
    assert targets["onnxruntime/cpu/fp32"] == "PASS"
    assert targets["tflite/xnnpack/fp32"] == "PASS"
    assert {t.split("/")[0] for t in targets} == {"onnxruntime", "tflite"}  # only enabled ones


def test_a_daemon_whose_targets_all_fail_their_probe_is_not_ready(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, '[mqtt]\nenabled = false\n[daemon]\ndemo_models = false\n'
                                '[backends]\nenabled = []\n').start()
    try:
        deadline = time.monotonic() + 90
        body = d.wait_for("/readyz", 503, timeout=90)
        while "targets" not in body["reasons"] and time.monotonic() < deadline:
            time.sleep(0.2)
            body = d.wait_for("/readyz", 503, timeout=90)
        assert "no backend target passed its probe" in body["reasons"]["targets"]
        assert d.request("GET", "/healthz")[0] == 200  # alive, just not ready
    finally:
        assert d.stop() == 0


def test_probing_stops_before_the_next_backend_once_the_daemon_stops(tmp_path: Path) -> None:
    """The probes run on an executor thread that a cancelled task does not stop, and at exit
    the interpreter waits for that thread: a daemon stopped while probing waited for every
    backend left (1.2 s of a 2.6 s SIGTERM here right after READY=1)."""
    config = parse_config({"daemon": {"state_dir": str(tmp_path)}})
    stop = threading.Event()
    asked: list[str] = []

    def backend_of(name: str) -> Backend:
        asked.append(name)
        stop.set()  # the daemon stops while the first backend is probed
        return load_backend(name, config.backends.options_of(name))

    results = run_selftests(config, None, backend_of, stop.is_set)
    assert asked == ["onnxruntime"] and [r.name for r in results] == ["onnxruntime"]
    # the backend under way finished its probe: its results are whole, not cut
    assert results[0].targets and {t.status for t in results[0].targets} <= {"PASS", "SKIP"}
    assert len(run_selftests(config, None, None, threading.Event().is_set)) > 1  # every one
