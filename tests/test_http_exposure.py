"""Exposure (issue 11, hole 7): a non-loopback ``[http] host`` without ``[http] token`` is
refused at start (exit 2, one line naming the keys) unless ``[http] allow_unauthenticated``."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_proc import DaemonProcess

from edgepilot.config import HttpSection, check_http_exposure, is_loopback_host
from edgepilot.errors import ConfigError

BASE = "[mqtt]\nenabled = false\n[daemon]\ndemo_models = false\n[dispatch]\nenabled = false\n"


def run_refused(tmp: Path, config: str, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp / "edgepilot.toml"
    cfg.write_text(BASE + config)
    return subprocess.run([sys.executable, "-m", "edgepilot", "--state-dir", str(tmp / "state"),
                           "--model-dir", str(tmp / "models"), "--config", str(cfg), "run",
                           "--port", "0", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("config", "args"), [
    ('[http]\nhost = "0.0.0.0"\n', ()),
    ("", ("--host", "0.0.0.0")),
    ('[http]\nhost = "::"\n', ()),
])
def test_non_loopback_host_without_token_is_refused_at_start(
        tmp_path: Path, config: str, args: tuple[str, ...]) -> None:
    proc = run_refused(tmp_path, config, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for key in ("[http] host", "[http] token", "[http] allow_unauthenticated = true"):
        assert key in lines[0], lines[0]
    assert proc.stdout == ""


def test_allow_unauthenticated_serves_a_non_loopback_host(tmp_path: Path,
                                                          daemon_factory: Any) -> None:
    d: DaemonProcess = daemon_factory(
        BASE + '[http]\nhost = "0.0.0.0"\nallow_unauthenticated = true\n',
        extra_args=["--model-dir", str(tmp_path / "models")])
    d.start()  # 0.0.0.0 includes loopback, where the test asks
    status, body = d.request("GET", "/v1/config")
    assert status == 200 and body["config"]["http"]["host"] == "0.0.0.0"
    assert body["config"]["http"]["allow_unauthenticated"] is True
    assert d.stop() == 0


def test_a_token_makes_a_non_loopback_host_acceptable() -> None:
    check_http_exposure("0.0.0.0", HttpSection(token="long-enough-token"))
    check_http_exposure("127.0.0.2", HttpSection())
    check_http_exposure("::1", HttpSection())
    check_http_exposure("localhost", HttpSection())
    with pytest.raises(ConfigError, match="allow_unauthenticated"):
        check_http_exposure("192.168.1.20", HttpSection())
    # a host name may resolve to any interface: it counts as exposed
    assert not is_loopback_host("board.local")


def test_config_reports_the_port_bound_for_port_0(tmp_path: Path, daemon_factory: Any) -> None:
    """Hole 9: ``run --port 0`` serves on a port the kernel picks; /v1/config says which."""
    d: DaemonProcess = daemon_factory(BASE, extra_args=["--model-dir", str(tmp_path / "models")])
    d.port = 0
    d.start(wait_healthy=False)
    found = wait_for_log(d, r"HTTP listening on http://127\.0\.0\.1:(\d+)")
    d.port = int(found)
    d.wait_for("/healthz")
    status, body = d.request("GET", "/v1/config")
    assert status == 200 and body["config"]["http"]["port"] == d.port != 0
    assert d.stop() == 0


def wait_for_log(d: DaemonProcess, pattern: str, timeout: float = 60.0) -> str:
    """The first group of ``pattern`` once the daemon's log has it (a bound, not a metric)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, d.output())
        if m:
            return m.group(1)
        assert d.proc is not None and d.proc.poll() is None, d.output()
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} never in the log:\n{d.output()}")


def test_a_reload_that_drops_the_token_of_an_exposed_daemon_is_rejected(
        tmp_path: Path, daemon_factory: Any) -> None:
    exposed = BASE + '[http]\nhost = "0.0.0.0"\ntoken = "exposure-token-1"\n'
    d: DaemonProcess = daemon_factory(exposed,
                                      extra_args=["--model-dir", str(tmp_path / "models")])
    d.start()
    assert d.config_path is not None
    d.config_path.write_text(BASE + '[http]\nhost = "0.0.0.0"\n')
    d.send_signal(signal.SIGHUP)
    wait_for_log(d, r"(reload rejected, keeping the running config: .*allow_unauthenticated)")
    status, body = d.request("GET", "/v1/config")
    assert status == 200 and body["config"]["http"]["token"] == "***"  # still the old config
    assert d.stop() == 0
