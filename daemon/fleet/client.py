"""The operator's MQTT 5 client: retained statuses in, commands out, each reply collected.

It needs only the broker (``[mqtt]`` host, port, credentials, TLS of the config it is given),
never a daemon on the machine it runs on. Commands carry MQTT 5 correlation data and a response
topic outside the daemons' namespace (``<prefix>-fleet/<client>``); a daemon names itself in its
reply's user property ``device_id``, so one group message collects many replies.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgepilot.config import MqttSection
from edgepilot.errors import EdgepilotError
from edgepilot.mqtt.client_setup import apply_tls

# after SUBACK the broker sends every retained status at once; this much quiet ends the burst
SETTLE_S = 0.3


class BrokerUnreachable(EdgepilotError):
    """The broker did not accept the connection in time."""


@dataclass
class Device:
    """One device as its retained status says, and when that status arrived."""

    device_id: str
    status: dict[str, Any]
    seen: float  # time.time() the status was received

    @property
    def online(self) -> bool:
        return self.status.get("state") == "online"

    @property
    def groups(self) -> list[str]:
        return list(self.status.get("groups") or [])


@dataclass
class RunResult:
    """Replies per device to one command, and who was asked but did not answer in time."""

    verb: str
    asked: list[str]
    replies: dict[str, dict[str, Any]] = field(default_factory=dict)
    elapsed_s: dict[str, float] = field(default_factory=dict)

    @property
    def missing(self) -> list[str]:
        return sorted(set(self.asked) - set(self.replies))

    def as_dict(self) -> dict[str, Any]:
        return {"verb": self.verb, "asked": sorted(self.asked), "replies": self.replies,
                "elapsed_s": self.elapsed_s, "not_answering": self.missing}


class FleetClient:
    """One paho client of the operator; use as a context manager."""

    def __init__(self, cfg: MqttSection, *, connect_timeout_s: float = 10.0) -> None:
        self.cfg = cfg
        self.prefix = cfg.topic_prefix
        self.connect_timeout_s = connect_timeout_s
        self.name = f"edgepilot-fleet-{uuid.uuid4().hex[:12]}"
        self.reply_topic = f"{self.prefix}-fleet/{self.name}"
        self.devices: dict[str, Device] = {}
        self.events: list[dict[str, Any]] = []
        self.telemetry: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._runs: dict[bytes, RunResult] = {}
        self._started: dict[bytes, float] = {}
        self._connected = threading.Event()
        self._subacks = 0
        self._last_status = 0.0
        self._refused: str | None = None
        self._subscribed_at = time.monotonic()
        self._extra: tuple[str, ...] = ()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.name,
                                  protocol=mqtt.MQTTv5)
        if cfg.username is not None:
            self.client.username_pw_set(cfg.username, cfg.password)
        if cfg.tls is not None:
            apply_tls(self.client, cfg.tls)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message

    # ---- connection -----------------------------------------------------------------------------
    def __enter__(self) -> FleetClient:
        self.connect()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def connect(self, extra: tuple[str, ...] = ()) -> None:
        """Connect, subscribe to the statuses, the replies and ``extra`` filters, and wait
        until the retained statuses arrived."""
        self._extra = extra
        try:
            self.client.connect(self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive_s)
        except OSError as exc:
            raise BrokerUnreachable(f"broker {self.cfg.host}:{self.cfg.port} unreachable: "
                                    f"{exc}", field="mqtt.host") from None
        self.client.loop_start()
        if not self._connected.wait(self.connect_timeout_s) or self._refused:
            self.close()
            raise BrokerUnreachable(
                f"broker {self.cfg.host}:{self.cfg.port} did not accept the connection"
                f"{': ' + self._refused if self._refused else ''} (check [mqtt] host, port, "
                "username, password)", field="mqtt.host")
        self._wait(lambda: self._subacks >= 1, self.connect_timeout_s)
        self.settle()

    def settle(self, quiet_s: float = SETTLE_S) -> None:
        """Wait until no status arrived for ``quiet_s`` (the retained burst is over)."""
        deadline = time.monotonic() + self.connect_timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                last = self._last_status
            if time.monotonic() - max(last, self._subscribed_at) >= quiet_s:
                return
            time.sleep(quiet_s / 3)

    @property
    def lock(self) -> threading.Lock:
        """Held while reading ``devices``, ``events`` or ``telemetry`` (paho's thread fills
        them)."""
        return self._lock

    def subscribe(self, topic: str) -> None:
        """Also follow ``topic`` (telemetry, events: kept in ``telemetry``, ``events``)."""
        self.client.subscribe(topic, qos=0)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _wait(self, pred: Any, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(pred, timeout_s)

    # ---- paho callbacks (its thread) ----------------------------------------------------------
    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            self._refused = str(reason)
            self._connected.set()
            return
        self._subscribed_at = time.monotonic()
        topics = [f"{self.prefix}/+/status", self.reply_topic, *self._extra]
        client.subscribe([(t, 1) for t in topics])
        self._connected.set()

    def _on_subscribe(self, *_args: Any) -> None:
        with self._cond:
            self._subacks += 1
            self._subscribed_at = time.monotonic()
            self._cond.notify_all()

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            body = json.loads(msg.payload) if msg.payload else None
        except ValueError:
            return  # not ours to read
        if not isinstance(body, dict):
            return
        now = time.monotonic()
        with self._cond:
            if msg.topic == self.reply_topic:
                self._reply(msg, body, now)
            elif msg.topic.endswith("/status"):
                dev = msg.topic[len(self.prefix) + 1:-len("/status")]
                if dev and "/" not in dev:
                    self.devices[dev] = Device(dev, body, time.time())
                    self._last_status = now
            elif msg.topic.endswith("/events"):
                self.events.append({**body, "device_id": msg.topic.split("/")[-2]})
            elif msg.topic.endswith("/telemetry"):
                self.telemetry[msg.topic.split("/")[-2]] = body
            self._cond.notify_all()

    def _reply(self, msg: mqtt.MQTTMessage, body: dict[str, Any], now: float) -> None:
        props = getattr(msg, "properties", None)
        raw = getattr(props, "CorrelationData", None)
        corr = bytes(raw) if raw else b""
        run = self._runs.get(corr)
        if run is None:
            return
        user = dict(getattr(props, "UserProperty", None) or [])
        dev = user.get("device_id")
        if dev is None and len(run.asked) == 1:
            dev = run.asked[0]
        if dev is not None:
            run.replies[dev] = body
            run.elapsed_s[dev] = round(now - self._started[corr], 4)

    # ---- the fleet ------------------------------------------------------------------------------
    def select(self, *, group: str | None = None, devices: list[str] | None = None
               ) -> list[str]:
        """Device ids a command goes to: the named ones, the members of ``group`` (``all``:
        every device with a retained status, online or not) per their statuses."""
        with self._lock:
            known = dict(self.devices)
        if devices:
            return sorted(set(devices))
        if group in (None, "all"):
            return sorted(known)
        return sorted(d for d, dev in known.items() if group in dev.groups)

    def run(self, verb: str, params: dict[str, Any] | None = None, *,
            devices: list[str], group: str | None = None, timeout_s: float = 5.0) -> RunResult:
        """Send ``verb`` to ``devices`` (one message to ``<prefix>/group/<group>/cmd/<verb>``
        when ``group`` names a configured group, else one per device) and collect the replies
        until every device answered or ``timeout_s`` passed."""
        corr = uuid.uuid4().bytes
        result = RunResult(verb, list(devices))
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.reply_topic
        props.CorrelationData = corr
        payload = json.dumps(params or {}).encode()
        with self._lock:
            self._runs[corr] = result
            self._started[corr] = time.monotonic()
        if group not in (None, "all"):
            topics = [f"{self.prefix}/group/{group}/cmd/{verb}"]
        else:
            topics = [f"{self.prefix}/{d}/cmd/{verb}" for d in devices]
        for topic in topics:
            self.client.publish(topic, payload, qos=1, properties=props)
        self._wait(lambda: not result.missing, timeout_s)
        with self._lock:
            del self._runs[corr]
            return RunResult(verb, result.asked, dict(result.replies), dict(result.elapsed_s))
