"""A real mosquitto for tests: own config in tmp_path, a free loopback port, persistence on.

Import the fixture explicitly: ``from tests.mqtt_fixtures import broker  # noqa: F401``.
``Broker.stop()`` / ``Broker.start()`` restart it on the same port (the buffering test), with
persistence so persistent sessions survive the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

T = TypeVar("T")
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05,
             what: str = "condition") -> Any:
    """Poll ``pred`` until truthy; fail with ``what`` after ``timeout`` (a bound, not a metric)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


class Broker:
    """One mosquitto process on 127.0.0.1:<port>, restartable on the same port."""

    def __init__(self, workdir: Path, port: int | None = None,
                 tls: tuple[Path, Path, Path] | None = None, *,
                 passwords: dict[str, str] | None = None,
                 require_certificate: bool = False) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.proc: subprocess.Popen[bytes] | None = None
        self.conf = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        workdir.mkdir(parents=True, exist_ok=True)
        self.password_file: Path | None = None
        if passwords is not None:  # every listener then needs a username and password
            self.password_file = workdir / "passwd"
            self.set_passwords(passwords)
        lines = [
            f"listener {self.port} 127.0.0.1",
            f"allow_anonymous {'false' if passwords is not None else 'true'}",
            "persistence true",
            f"persistence_location {workdir}/",
            "persistence_file mosquitto.db",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "max_queued_messages 100000",
        ]
        self.tls_port: int | None = None
        if tls is not None:  # (ca, cert, key): a second listener with TLS
            self.tls_port = free_port()
            ca, cert, key = tls
            lines += [f"listener {self.tls_port} 127.0.0.1", f"cafile {ca}", f"certfile {cert}",
                      f"keyfile {key}"]
            if require_certificate:  # mutual TLS: clients must show a cert signed by the CA
                lines.append("require_certificate true")
        if self.password_file is not None:
            lines.append(f"password_file {self.password_file}")
        if os.geteuid() == 0:
            lines.append("user root")  # else it drops to 'mosquitto', who cannot write workdir
        self.conf.write_text("\n".join(lines) + "\n")

    def set_passwords(self, passwords: dict[str, str]) -> None:
        """(Re)write the password file, hashed by ``mosquitto_passwd -U``; a running broker
        re-reads it on SIGHUP."""
        assert self.password_file is not None, "broker made without passwords"
        self.password_file.write_text("".join(f"{u}:{p}\n" for u, p in passwords.items()))
        subprocess.run([MOSQUITTO_PASSWD, "-U", str(self.password_file)], check=True, timeout=30,
                       capture_output=True)
        if self.proc is not None:
            self.proc.send_signal(signal.SIGHUP)

    def start(self, timeout: float = 15.0) -> None:
        assert self.proc is None, "broker already running"
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=logf,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port),
                                                                        timeout=0.2):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mosquitto did not listen on {self.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM (mosquitto saves its persistence file) and wait."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A running mosquitto on a free loopback port, stopped at the end."""
    b = Broker(tmp_path / "broker")
    b.start()
    try:
        yield b
    finally:
        b.stop()


def make_test_ca(workdir: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    workdir.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (workdir / n for n in
                                  ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    san = workdir / "san.cnf"
    san.write_text("subjectAltName=IP:127.0.0.1\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, timeout=60, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "2", "-subj", "/CN=edgepilot-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(san))
    return ca, cert, key


def make_client_cert(workdir: Path, name: str = "client") -> tuple[Path, Path]:
    """A client certificate and key signed by the CA :func:`make_test_ca` made in ``workdir``."""
    ca, ca_key = workdir / "ca.pem", workdir / "ca.key"
    key, csr, cert = (workdir / f"{name}{ext}" for ext in (".key", ".csr", ".pem"))
    for args in (["req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
                  "-subj", f"/CN={name}"],
                 ["x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
                  "-CAcreateserial", "-out", str(cert), "-days", "2"]):
        subprocess.run(["openssl", *args], check=True, timeout=60, capture_output=True)
    return cert, key


class Recorder:
    """A paho subscriber collecting messages per topic (thread-safe), for assertions."""

    def __init__(self, broker: Broker, topics: list[str], *, client_id: str = "",
                 persistent: bool = False, v5: bool = True, qos: int = 1,
                 username: str | None = None, password: str | None = None) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.topics = topics
        self.qos = qos
        self.v5 = v5
        self.persistent = persistent
        if v5:
            self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                      protocol=mqtt.MQTTv5)
        else:
            self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                      protocol=mqtt.MQTTv311, clean_session=not persistent)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.reconnect_delay_set(1, 1)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_disconnect = lambda *a: self.connected.clear()
        self.client.on_subscribe = lambda *a: self.subscribed.set()
        props = None
        clean_start: Any = True if v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY
        if v5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.CONNECT)
            if persistent:
                props.SessionExpiryInterval = 3600
                clean_start = False
        self.client.connect_async(broker.host, broker.port, keepalive=10,
                                  clean_start=clean_start,
                                  properties=props)
        self.client.loop_start()
        wait_for(self.subscribed.is_set, what="test subscriber subscribed")

    def _on_connect(self, client: mqtt.Client, _u: Any, flags: Any, reason: Any, _p: Any) -> None:
        if not flags.session_present or not self.persistent:
            client.subscribe([(t, self.qos) for t in self.topics])
        else:
            self.subscribed.set()  # the broker kept the session's subscriptions
        self.connected.set()

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append(msg)

    def on(self, topic: str) -> list[mqtt.MQTTMessage]:
        with self.lock:
            return [m for m in self.messages if m.topic == topic]

    def json_on(self, topic: str) -> list[dict[str, Any]]:
        return [json.loads(m.payload) for m in self.on(topic)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class LoopThread:
    """An asyncio loop in a thread, so a test can run daemon services and block on paho."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Run a plain function on the loop thread (where daemon code expects to run)."""
        async def wrapper() -> T:
            return fn()
        return self.run(wrapper(), timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class InProcessDaemon:
    """A Daemon with status, serving, telemetry and MQTT attached and started on a LoopThread.

    The real services, the real broker; only the HTTP server and the other capabilities are
    left out, which these tests do not exercise (serving loads nothing until asked).
    """

    def __init__(self, state_dir: Path, broker: Broker, *, mqtt_cfg: dict[str, Any] | None = None,
                 telemetry: dict[str, Any] | None = None) -> None:
        from edgepilot.config import parse_config
        from edgepilot.lifecycle import Daemon

        mqtt_section = {"host": broker.host, "port": broker.port, "device_id": "dev1",
                        "reconnect_min_s": 0.05, "reconnect_max_s": 0.5, **(mqtt_cfg or {})}
        cfg = parse_config({"daemon": {"state_dir": str(state_dir), "demo_models": False},
                            "telemetry": telemetry or {"sample_interval_s": 0.1,
                                                       "publish_interval_s": 3600},
                            "mqtt": mqtt_section})
        self.daemon = Daemon(cfg)
        self.daemon.attach_capabilities({"status", "serving", "telemetry", "mqtt"})
        self.lt = LoopThread()
        self.started = False

    async def _start(self) -> None:
        for svc in self.daemon.services:
            await svc.start()

    async def _stop(self) -> None:
        for svc in reversed(self.daemon.services):
            await svc.stop()

    def start(self) -> InProcessDaemon:
        self.lt.run(self._start())
        self.started = True
        return self

    def stop(self) -> None:
        """Stop the services (clean stop: retained offline, seq and spool saved); idempotent."""
        if self.started:
            self.lt.run(self._stop())
            self.started = False
        if not self.lt.loop.is_closed():
            self.lt.close()
            self.daemon.executor.shutdown(wait=False)

    def report(self) -> dict[str, Any]:
        """Build and publish one telemetry report now (as the sampler does on its period)."""
        result: dict[str, Any] = self.lt.call(lambda: self.daemon.telemetry.report())
        return result
