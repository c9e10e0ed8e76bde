"""The broker connection: paho-mqtt 2.x in its own network thread, never blocking the daemon.

Threading rule: paho calls us on its thread, sometimes while holding its own locks (``on_publish``
runs under its out-message mutex), so its callbacks only hand work to the daemon loop with
``call_soon_threadsafe``; every ``publish`` happens on the loop. That keeps ordering simple:

- everything outbound goes through the :class:`Outbox` and is handed to paho only while
  connected, at most ``window`` unacknowledged at a time (so the outbox stays the one bound);
- on reconnect, whatever paho still holds unacknowledged is taken back (``drop_out_messages``)
  and put in front of the outbox, then the outbox drains in order. Delivery is at least once for
  QoS 1 (a message in flight when the link died is sent again), in order.

The retained ``status`` says ``online`` on every connect; the broker publishes the retained
``offline`` last will when we vanish, and :meth:`MqttLink.stop` publishes it on a clean stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edgepilot.config import MqttSection
from edgepilot.errors import ConfigError
from edgepilot.mqtt.outbox import Outbox, OutMessage
from edgepilot.mqtt.topics import Topics

log = logging.getLogger(__name__)

Incoming = Callable[[str, bytes, Any], None]


class MqttLink:
    """One paho client: connect in the background, publish through the outbox, reconnect."""

    def __init__(self, cfg: MqttSection, topics: Topics, outbox: Outbox, *,
                 loop: asyncio.AbstractEventLoop, online: Callable[[], bytes],
                 offline: bytes, on_command: Incoming,
                 on_connected: Callable[[], None] | None = None, window: int = 64) -> None:
        self.cfg = cfg
        self.topics = topics
        self.outbox = outbox
        self.loop = loop
        self.window = window
        self._online = online
        self._offline = offline
        self._on_command = on_command
        self._on_connected = on_connected
        self._connected = False
        self._stopping = False
        self._pending: set[int] = set()
        self._fail_logged = False
        self.connects = 0
        self.v5 = cfg.protocol == "5"
        self.client = self._make_client()

    # ---- construction -----------------------------------------------------------------------
    def _make_client(self) -> mqtt.Client:
        cfg = self.cfg
        client_id = cfg.client_id or f"edgepilot-{cfg.device_id}"
        if self.v5:
            client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                 protocol=mqtt.MQTTv5)
        else:
            client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                 protocol=mqtt.MQTTv311, clean_session=True)
        if cfg.username is not None:
            client.username_pw_set(cfg.username, cfg.password)
        if cfg.tls is not None:
            tls = cfg.tls
            for name in ("ca_file", "cert_file", "key_file"):
                path = getattr(tls, name)
                if path is not None and not path.is_file():
                    raise ConfigError(f"[mqtt.tls] {name} {path} does not exist or is not a file",
                                      field=f"mqtt.tls.{name}")
            try:
                client.tls_set(ca_certs=str(tls.ca_file) if tls.ca_file else None,
                               certfile=str(tls.cert_file) if tls.cert_file else None,
                               keyfile=str(tls.key_file) if tls.key_file else None)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise ConfigError(f"[mqtt.tls] cannot be used: {exc}", field="mqtt.tls") from None
            client.tls_insecure_set(tls.insecure)
        client.will_set(self.topics.status, self._offline, qos=1, retain=True)
        # paho's reconnect backoff doubles from min to max; it takes ints, we allow sub-second
        client.reconnect_delay_set(cfg.reconnect_min_s, cfg.reconnect_max_s)  # type: ignore[arg-type]
        client.on_connect = self._cb_connect
        client.on_connect_fail = self._cb_connect_fail
        client.on_disconnect = self._cb_disconnect
        client.on_publish = self._cb_publish
        client.on_message = self._cb_message
        return client

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def in_flight(self) -> int:
        """Messages handed to paho and not yet acknowledged."""
        return len(self._pending)

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Begin connecting in the background; returns at once (the broker may be down)."""
        props = None
        if self.v5:
            props = Properties(mqtt.PacketTypes.CONNECT)
            props.SessionExpiryInterval = 0
        self.client.connect_async(self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive_s,
                                  clean_start=True if self.v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
                                  properties=props)
        self.client.loop_start()

    async def stop(self, offline: bytes | None = None, timeout_s: float = 3.0) -> None:
        """Flush what can be flushed, publish retained ``offline``, disconnect, stop the thread."""
        deadline = self.loop.time() + timeout_s
        while self._connected and (len(self.outbox) or self._pending) \
                and self.loop.time() < deadline:
            self.drain()
            await asyncio.sleep(0.02)
        self._stopping = True
        if self._connected:
            info = self.client.publish(self.topics.status, offline or self._offline, qos=1,
                                       retain=True)
            remaining = max(0.1, deadline - self.loop.time())
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: info.wait_for_publish(timeout=remaining))
            except (RuntimeError, ValueError) as exc:  # the link died meanwhile: the will says it
                log.debug("offline status not confirmed: %s", exc)
        self._connected = False
        self.client.disconnect()
        await asyncio.get_running_loop().run_in_executor(None, self.client.loop_stop)
        self._take_back()

    # ---- publishing (loop thread only) ------------------------------------------------------
    def send(self, msg: OutMessage) -> None:
        """Queue a message; it goes out now when connected, else when the broker is back."""
        self.outbox.put(msg)
        self.drain()

    def send_threadsafe(self, msg: OutMessage) -> None:
        """:meth:`send` from any thread (event subscribers are called on the emitter's)."""
        self.outbox.put(msg)
        self._call_soon(self.drain)

    def drain(self) -> None:
        """Hand queued messages to paho while connected and under the in-flight window."""
        while self._connected and not self._stopping and len(self._pending) < self.window:
            msg = self.outbox.pop()
            if msg is None:
                return
            info = self.client.publish(msg.topic, msg.payload, qos=msg.qos, retain=msg.retain,
                                       properties=msg.properties)
            if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                self._pending.add(info.mid)
            elif info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN and msg.qos > 0:
                # paho keeps it and we take it back on reconnect; stop until then
                self._connected = False
                return
            else:
                self.outbox.push_front([msg])
                log.debug("publish to %s refused (%s); kept for later", msg.topic, info.rc)
                return

    def _take_back(self, back: list[mqtt.MQTTMessage] | None = None) -> None:
        if back is None:
            back = self.client.drop_out_messages()
        self._pending.clear()
        keep = [OutMessage(topic=m.topic, payload=bytes(m.payload), qos=m.qos, retain=m.retain,
                           properties=m.properties if self.v5 else None,
                           spool=m.topic in (self.topics.telemetry, self.topics.events))
                for m in back if m.topic != self.topics.status]
        if keep:
            self.outbox.push_front(keep)

    def _connected_on_loop(self, back: list[mqtt.MQTTMessage]) -> None:
        if self._stopping:
            return
        self._take_back(back)
        self._connected = True
        self.connects += 1
        self._fail_logged = False
        log.info("MQTT connected to %s:%d (%d queued)", self.cfg.host, self.cfg.port,
                 len(self.outbox))
        self.client.publish(self.topics.status, self._online(), qos=1, retain=True)
        if self._on_connected is not None:
            try:
                self._on_connected()
            except Exception:
                log.exception("MQTT on-connect hook failed")
        self.drain()

    def _acked_on_loop(self, mid: int) -> None:
        self._pending.discard(mid)
        self.drain()

    # ---- paho callbacks (paho thread: hand off, never block) -----------------------------
    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # loop closed while the daemon exits
            self.loop.call_soon_threadsafe(fn, *args)

    def _cb_connect(self, client: mqtt.Client, _u: Any, flags: mqtt.ConnectFlags,
                    reason: ReasonCode, _p: Any) -> None:
        if reason.is_failure:
            log.error("MQTT broker %s:%d refused the connection: %s (check [mqtt] username, "
                      "password, client_id and the broker ACL)", self.cfg.host, self.cfg.port,
                      reason)
            return
        # Take back what paho still holds before it resends it itself: the loop puts it in
        # front of the outbox so old and new messages leave in one order.
        back = client.drop_out_messages()
        client.subscribe([(t, self.cfg.qos) for t in self.topics.subscriptions()])
        self._call_soon(self._connected_on_loop, back)

    def _cb_connect_fail(self, _c: mqtt.Client, _u: Any) -> None:
        level = logging.DEBUG if self._fail_logged else logging.WARNING
        log.log(level, "MQTT broker %s:%d unreachable; retrying with backoff (up to %.1fs); "
                "messages are buffered", self.cfg.host, self.cfg.port, self.cfg.reconnect_max_s)
        self._fail_logged = True

    def _cb_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode,
                       _p: Any) -> None:
        # a plain bool store is atomic; publishing stops at the next drain check
        self._connected = False
        if not self._stopping:
            log.warning("MQTT connection lost (%s); buffering until the broker is back", reason)

    def _cb_publish(self, _c: mqtt.Client, _u: Any, mid: int, _r: Any, _p: Any) -> None:
        self._call_soon(self._acked_on_loop, mid)

    def _cb_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        self._call_soon(self._on_command, msg.topic, bytes(msg.payload),
                        getattr(msg, "properties", None))
