"""``/readyz`` reports each backend target's tiny probe (doctor's), run once at start."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProcess


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
