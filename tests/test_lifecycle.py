"""The daemon as systemd runs it: notify protocol, watchdog, signals, reload, start-up errors."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_proc import DaemonProcess, free_port
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).parent.parent
QUIET = "[daemon]\ndemo_models = false\n[mqtt]\nenabled = false\n"


class NotifySocket:
    """The datagram socket systemd would own; collects every notification line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.lines: list[str] = []

    def collect(self, until: str, timeout: float = 30.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if until in self.lines:
                return self.lines
            with contextlib.suppress(TimeoutError):
                self.lines.extend(self.sock.recv(4096).decode().splitlines())
        raise AssertionError(f"no {until!r} within {timeout}s; got {self.lines}")

    def collect_for(self, seconds: float) -> list[str]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                self.lines.extend(self.sock.recv(4096).decode().splitlines())
        return self.lines

    def close(self) -> None:
        self.sock.close()


def test_notify_ready_watchdog_stopping_and_clean_exit(tmp_path: Path) -> None:
    ns = NotifySocket(tmp_path / "notify.sock")
    d = DaemonProcess(tmp_path, QUIET,
                      env={"NOTIFY_SOCKET": str(ns.path), "WATCHDOG_USEC": "200000"})
    d.start(wait_healthy=False)
    try:
        ns.collect("READY=1")
        # the watchdog pings at half of WATCHDOG_USEC: several arrive within a second
        ns.lines.clear()
        ns.collect_for(1.0)
        assert ns.lines.count("WATCHDOG=1") >= 3, ns.lines
        assert d.request("GET", "/healthz")[0] == 200
        code, body = d.request("GET", "/readyz")
        assert code == 200, body
        code, text = d.request("GET", "/metrics")
        assert code == 200
        names = {f.name for f in text_string_to_metric_families(text)}
        assert "edgepilot_up" in names
        started = time.monotonic()
        rc = d.stop(signal.SIGTERM, timeout=10)
        assert rc == 0, d.output()
        assert time.monotonic() - started < 10
        ns.collect("STOPPING=1", timeout=2)
    finally:
        ns.close()


def test_sighup_reload_applies_valid_and_keeps_old_on_broken(tmp_path: Path) -> None:
    ns = NotifySocket(tmp_path / "notify.sock")
    d = DaemonProcess(tmp_path, QUIET + "[telemetry]\nsample_interval_s = 1.0\n",
                      env={"NOTIFY_SOCKET": str(ns.path)})
    d.start()
    try:
        ns.collect("READY=1")
        assert d.config_path is not None
        d.config_path.write_text(QUIET + "[telemetry]\nsample_interval_s = 2.5\n")
        ns.lines.clear()
        d.send_signal(signal.SIGHUP)
        ns.collect("RELOADING=1")
        ns.collect("READY=1")
        cfg = d.request("GET", "/v1/config")[1]["config"]
        assert cfg["telemetry"]["sample_interval_s"] == 2.5

        d.config_path.write_text(QUIET + "[telemetry]\nsample_interval_s = 'fast'\nbogus = 1\n")
        ns.lines.clear()
        d.send_signal(signal.SIGHUP)
        ns.collect("RELOADING=1")
        ns.collect("READY=1")
        assert d.request("GET", "/healthz")[0] == 200
        cfg = d.request("GET", "/v1/config")[1]["config"]
        assert cfg["telemetry"]["sample_interval_s"] == 2.5  # old config kept
        assert "reload rejected" in d.output()
        assert "telemetry.bogus" in d.output()
    finally:
        assert d.stop() == 0
        ns.close()


def test_unknown_config_key_fails_startup_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[http]\nport = 8470\nprot = 1\n[mqtt]\nqos = 7\n")
    proc = subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir",
         str(tmp_path / "s"), "run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown key 'http.prot'" in proc.stderr
    assert "'mqtt.qos'" in proc.stderr and "1 or 2" in proc.stderr


def test_state_dir_that_cannot_be_made_is_one_line_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = subprocess.run(
        [sys.executable, "-m", "edgepilot", "--state-dir", str(blocker / "state"), "run",
         "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "state_dir" in proc.stderr and str(blocker / "state") in proc.stderr


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        d = DaemonProcess(tmp_path, QUIET, port=port)
        d.start(wait_healthy=False)
        assert d.proc is not None
        rc = d.proc.wait(timeout=60)
        d._log.close()
    assert rc == 2
    assert f"cannot bind HTTP on 127.0.0.1:{port}" in d.output()


def test_bad_command_does_not_stop_the_daemon(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, QUIET).start()
    try:
        code, body = d.request("POST", "/v1/commands/no.such.verb", {})
        assert code == 404 and body["error"]["field"] == "verb"
        assert "status" in body["error"]["message"]  # lists the allowed verbs
        code, body = d.request("POST", "/v1/commands/status", b"{not json")
        assert code == 400 and body["error"]["field"] == "body"
        code, body = d.request("POST", "/v1/commands/status", {"unexpected": 1})
        assert code == 400 and body["error"]["field"] == "unexpected"
        code, body = d.request("POST", "/v1/commands/status", {})
        assert code == 200 and body["ok"] is True and body["result"]["version"]
    finally:
        assert d.stop() == 0


def test_oversize_body_is_refused_with_413(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, QUIET + "[http]\nmax_body_bytes = 2048\n").start()
    try:
        code, body = d.request("POST", "/v1/commands/status", b"{" + b" " * 4096 + b"}")
        assert code == 413 and "max_body_bytes" in body["error"]["message"]
        assert d.request("GET", "/healthz")[0] == 200
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("unit", ["edgepilot.service"])
def test_systemd_unit_verifies_clean(tmp_path: Path, unit: str) -> None:
    # systemd-analyze verify also checks that ExecStart exists: point it at this install's
    # console script; everything else is verified as shipped.
    exe = Path(sys.executable).parent / "edgepilot"
    assert exe.exists()
    text = (REPO / "systemd" / unit).read_text().replace("/usr/local/bin/edgepilot", str(exe))
    (tmp_path / unit).write_text(text)
    proc = subprocess.run(["systemd-analyze", "verify", str(tmp_path / unit)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "edgepilot.service" not in proc.stderr, proc.stderr


def test_free_port_helper_gives_bindable_port() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_sighup_refuses_what_only_the_running_daemon_can_judge(tmp_path: Path) -> None:
    ns = NotifySocket(tmp_path / "notify.sock")
    d = DaemonProcess(tmp_path, QUIET, env={"NOTIFY_SOCKET": str(ns.path)})
    d.start()
    try:
        ns.collect("READY=1")
        assert d.config_path is not None
        for bad, named in (
                (QUIET + '[dvfs]\nprofile = "turbo"\n', "unknown profile 'turbo'"),
                (QUIET + '[[models]]\nname = "x"\nfile = "../../etc/passwd.onnx"\n',
                 "resolves outside the model dir")):
            d.config_path.write_text(bad)
            ns.lines.clear()
            d.send_signal(signal.SIGHUP)
            ns.collect("RELOADING=1")
            ns.collect("READY=1")
            assert named in d.output()
            cfg = d.request("GET", "/v1/config")[1]["config"]
            assert cfg["dvfs"]["profile"] is None and cfg["models"] == []  # old config kept
        assert d.output().count("reload rejected") == 2
    finally:
        assert d.stop() == 0
        ns.close()


def test_systemd_unit_does_what_a_real_board_needs() -> None:
    """Read the unit as systemd would on a Jetson/Pi: no restart loop on an operator error,
    no mandatory config file, nvpmodel's state writable, no device allow-list that shuts out
    vendor GPU/NPU nodes (misc majors, /dev/dri is a directory DeviceAllow= cannot name)."""
    import shlex

    keys: dict[str, list[str]] = {}
    for line in (REPO / "systemd" / "edgepilot.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            keys.setdefault(k.strip(), []).append(v.strip())
    exec_start = shlex.split(keys["ExecStart"][0])
    assert "--config" not in exec_start and exec_start[-1] == "run"
    # 2 is the CLI's exit status for operator errors (next test)
    assert "2" in " ".join(keys["RestartPreventExitStatus"]).split()
    assert "-/var/lib/nvpmodel" in " ".join(keys["ReadWritePaths"]).split()
    assert "DeviceAllow" not in keys and keys.get("DevicePolicy", ["auto"]) == ["auto"]
    assert {"video", "render"} <= set(" ".join(keys["SupplementaryGroups"]).split())
    stop_s = int(keys["TimeoutStopSec"][0].rstrip("s"))
    assert stop_s >= 10 + 2 * 10 + 10  # drain + two tool timeouts + sysfs restore


def test_missing_config_file_exits_2_the_status_the_unit_does_not_restart(
        tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "edgepilot", "--config",
                           str(tmp_path / "absent.toml"), "--state-dir", str(tmp_path / "s"),
                           "run", "--port", "0"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
