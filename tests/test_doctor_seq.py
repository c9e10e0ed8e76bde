"""``doctor``'s telemetry seq is the one telemetry published, not the bound reserved on disk."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProcess

from edgepilot.mqtt.state_report import spool_info
from edgepilot.telemetry.seq import PersistentSeq

CONFIG = """
[mqtt]
enabled = false
[daemon]
demo_models = false
[telemetry]
sample_interval_s = 0.1
publish_interval_s = 0.1
"""


def doctor(d: DaemonProcess) -> str:
    assert d.config_path is not None
    res = subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(d.config_path), "--state-dir",
         str(d.state_dir), "doctor", "--backend", "onnxruntime"],
        capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout


def published(d: DaemonProcess) -> int:
    code, body = d.request("GET", "/v1/telemetry")
    assert code == 200, body
    return int(body["seq"])


def test_doctor_reports_the_seq_telemetry_published(tmp_path: Path,
                                                    daemon_factory: Any) -> None:
    d: DaemonProcess = daemon_factory(CONFIG).start()
    try:
        deadline = time.monotonic() + 60
        while published(d) < 3:
            assert time.monotonic() < deadline, d.output()
            time.sleep(0.1)
        before = published(d)
        text = doctor(d)
        after = published(d)
        found = re.search(r"last telemetry seq published: (\d+)", text)
        assert found, text
        # numbers are reserved on disk in blocks of 1000: doctor must not report the bound
        assert before <= int(found.group(1)) <= after, (before, found.group(1), after)
    finally:
        assert d.stop() == 0
    # a clean stop: both files hold the exact last number
    info = spool_info(d.state_dir)
    assert info["seq_published"] == info["seq_recorded"] >= after


def test_seq_files_after_a_crash(tmp_path: Path) -> None:
    seq = PersistentSeq(tmp_path / "telemetry.seq", block=100)
    last = [seq.next() for _ in range(7)][-1]
    # no close(): what a crash leaves
    info = spool_info(tmp_path)
    assert info["seq_published"] == last == 7
    assert info["seq_recorded"] == 100  # the reserved bound the next run starts above
    assert PersistentSeq(tmp_path / "telemetry.seq", block=100).next() == 101
