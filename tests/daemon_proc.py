"""Run the real daemon as a subprocess on a free port, for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DaemonProcess:
    """``python -m edgepilot ... run`` with its output captured to a file."""

    def __init__(self, tmp: Path, config: str | None = None, *, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.tmp = tmp
        self.port = port or free_port()
        self.state_dir = tmp / "state"
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = tmp / "edgepilot.toml"
            self.config_path.write_text(config)
        self.log_path = tmp / "daemon.log"
        self.extra_args = extra_args or []
        self.env = {**os.environ, **(env or {})}
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        args = [sys.executable, "-m", "edgepilot", "--state-dir", str(self.state_dir)]
        if self.config_path is not None:
            args += ["--config", str(self.config_path)]
        return [*args, *self.extra_args, "run", "--port", str(self.port)]

    def start(self, wait_healthy: bool = True, timeout: float = 60.0) -> DaemonProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.argv(), stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env)
        if wait_healthy:
            self.wait_for("/healthz", timeout=timeout)
        return self

    def wait_for(self, path: str, status: int = 200, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.output()}")
            try:
                code, body = self.request("GET", path)
                if code == status:
                    return body
                last = (code, body)
            except OSError as exc:
                last = exc
            time.sleep(0.1)
        raise AssertionError(f"{path} never answered {status} (last: {last}):\n{self.output()}")

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None, timeout: float = 30.0
                ) -> tuple[int, Any]:
        data = None
        hdrs = dict(headers or {})
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, _decode(resp.read(), resp.headers.get("content-type", ""))
        except urllib.error.HTTPError as err:
            return err.code, _decode(err.read(), err.headers.get("content-type", ""))

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"daemon did not exit within {timeout}s:\n{self.output()}") from None
        finally:
            self._log.close()
        return rc

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _decode(raw: bytes, content_type: str) -> Any:
    if "json" in content_type:
        return json.loads(raw)
    return raw.decode(errors="replace")
