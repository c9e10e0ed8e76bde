"""A real mosquitto for tests: own config in tmp_path, a free loopback port, persistence on.

Import the fixture explicitly: ``from tests.mqtt_fixtures import broker  # noqa: F401``.
``Broker.stop()`` / ``Broker.start()`` restart it on the same port (the buffering test), with
persistence so persistent sessions survive the restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


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

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.proc: subprocess.Popen[bytes] | None = None
        self.conf = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        workdir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            "persistence true",
            f"persistence_location {workdir}/",
            "persistence_file mosquitto.db",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "max_queued_messages 100000",
        ]
        if os.geteuid() == 0:
            lines.append("user root")  # else it drops to 'mosquitto', who cannot write workdir
        self.conf.write_text("\n".join(lines) + "\n")

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


class Recorder:
    """A paho subscriber collecting messages per topic (thread-safe), for assertions."""

    def __init__(self, broker: Broker, topics: list[str], *, client_id: str = "",
                 persistent: bool = False, v5: bool = True, qos: int = 1) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.lock = threading.Lock()
        self.connected = threading.Event()
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
        self.client.reconnect_delay_set(1, 1)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_disconnect = lambda *a: self.connected.clear()
        props = None
        clean_start: Any = True
        if v5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.CONNECT)
            if persistent:
                props.SessionExpiryInterval = 3600
                clean_start = False
        self.client.connect_async(broker.host, broker.port, keepalive=10,
                                  clean_start=clean_start if v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
                                  properties=props)
        self.client.loop_start()
        wait_for(self.connected.is_set, what="test subscriber connected")

    def _on_connect(self, client: mqtt.Client, _u: Any, flags: Any, reason: Any, _p: Any) -> None:
        if not flags.session_present or not self.persistent:
            client.subscribe([(t, self.qos) for t in self.topics])
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
