"""`edgepilot doctor --json` on this machine: generic board, every backend target probed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from daemon_proc import free_port


def run_doctor(tmp_path: Path, *extra: str, config: str = "",
               doctor_args: tuple[str, ...] = ()) -> tuple[int, dict]:
    cfg = tmp_path / "c.toml"
    cfg.write_text(config)
    proc = subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir",
         str(tmp_path / "state"), *extra, "doctor", "--json", *doctor_args],
        capture_output=True, text=True, timeout=240)
    return proc.returncode, json.loads(proc.stdout)


def test_doctor_reports_generic_board_and_every_target(tmp_path: Path) -> None:
    closed = free_port()  # nothing listens there: doctor must say unreachable, with why
    rc, report = run_doctor(tmp_path, config=f"[mqtt]\nhost = '127.0.0.1'\nport = {closed}\n")
    assert rc == 0
    assert report["board"]["identity"]["family"] == "generic"
    by_name = {b["name"]: b for b in report["backends"]}
    assert set(by_name) == {"onnxruntime", "tflite", "armnn", "llamacpp"}
    for b in by_name.values():
        assert b["available"], b
        assert b["targets"], b
        for t in b["targets"]:
            assert t["status"] in ("PASS", "FAIL", "SKIP") and t["reason"], t
    status = {t["target"]: t["status"] for b in by_name.values() for t in b["targets"]}
    # the real targets of this machine all pass their probe
    for target in ("onnxruntime/cpu/fp32", "onnxruntime/cpu/int8", "onnxruntime/cpu/int4",
                   "tflite/xnnpack/fp32", "tflite/xnnpack/int8", "tflite/cpu/int8",
                   "armnn/CpuRef/fp32", "armnn/CpuRef/fp16", "armnn/CpuRef/int8",
                   "llamacpp/cpu/native"):
        assert status[target] == "PASS", (target, by_name)
    # every target found here has a probe model it can run: nothing is left untested
    assert set(status.values()) == {"PASS"}, status
    assert report["state_dir"]["writable"] is True
    assert report["mqtt"]["reachable"] is False
    assert "refused" in report["mqtt"]["reason"].lower()


def test_doctor_reads_a_fake_board_tree(tmp_path: Path) -> None:
    from board_fixtures import build_tree

    fake = build_tree(tmp_path / "orin", "orin")
    try:
        rc, report = run_doctor(tmp_path, "--sysfs-root", str(fake.root),
                                config="[mqtt]\nenabled = false\n",
                                doctor_args=("--backend", "onnxruntime"))
    finally:
        fake.close()
    assert rc == 0
    board = report["board"]
    assert board["identity"]["family"] == "jetson-orin"
    assert {p["name"] for p in board["policies"]} == {"policy0", "policy4"}
    assert any(d["name"] == "17000000.gpu" and d["kind"] == "gpu" for d in board["devfreq"])
    assert [Path(p).name for p in board["profile_files"]] == ["generic.toml", "jetson-orin.toml"]
    assert report["mqtt"]["reachable"] is None
    # a fake root never runs the vendor tools found on PATH
    assert board["vendor_tools"]["nvpmodel"]["path"] is None
    assert "not '/'" in board["vendor_tools"]["nvpmodel"]["skipped"]
