"""The broker connection: paho-mqtt 2.x in its own network thread, never blocking the daemon.

Threading rule: paho calls us on its thread, sometimes while holding its own locks (``on_publish``
runs under its out-message mutex), so its callbacks only hand work to the daemon loop with
``call_soon_threadsafe``; every ``publish`` happens on the loop. That keeps ordering simple:

- everything outbound goes through the :class:`Outbox` and is handed to paho only while
  connected, at most ``window`` unacknowledged at a time (so the outbox stays the one bound);
- on reconnect, whatever paho still holds unacknowledged is taken back (``drop_out_messages``)
  and put in front of the outbox, then the outbox drains in order.

Delivery guarantees, by ``[mqtt] qos``:

- **QoS 1 (default): at least once, in order.** A message in flight when the link died is sent
  again, so a consumer can see one twice; every telemetry report carries a ``seq`` that only
  increases, so dropping a ``seq`` already seen makes it exactly once at the consumer. QoS 1 stays
  the default because it costs one packet per message instead of four round trips, works on every
  broker and both protocol versions, and needs no session state kept on the broker.
- **QoS 2 on MQTT 5: exactly once, in order, also across a broker restart.** The client keeps a
  persistent session (``SessionExpiryInterval = session_expiry_s``). The first connect starts
  it clean (a previous run's half-done handshakes are not ours to finish: the spool resends
  them), then the link disconnects and enters it again with clean start off, because mosquitto
  saves over a restart only sessions whose last CONNECT had clean start off. When the broker
  says the session is still there, nothing is taken back: paho finishes the unfinished
  handshakes itself with the same packet ids (PUBLISH with DUP, or PUBREL), which is what lets
  the broker drop a repeat, and new messages wait until those are acknowledged so the order
  holds. When the session is gone (expired, broker lost its state), the in-flight messages are
  sent again as new ones: at least once for those. The broker must keep its state over the
  restart (mosquitto: ``persistence true``; it saves on a clean stop and every
  ``autosave_interval``), otherwise its queued messages are lost anyway. Measured with the
  test's burst: QoS 1 delivered 4-6 duplicates per broker restart, QoS 2 none.
- QoS 2 on MQTT 3.1.1 uses a clean session (3.1.1 cannot start clean once and resume later,
  and resuming a stale session could make the broker drop new messages as repeats), so it is
  exactly once per connection and at least once across a reconnect, like QoS 1.

The retained ``status`` says ``online`` on every connect; the broker publishes the retained
``offline`` last will when we vanish, and :meth:`MqttLink.stop` publishes it on a clean stop.

A session another client with the same client id takes over is not fought over: the link says
so and backs off (:mod:`edgepilot.mqtt.takeover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edgepilot.config import MqttSection
from edgepilot.mqtt.client_setup import describe_closed_early, describe_connect_error, make_client
from edgepilot.mqtt.outbox import Outbox, OutMessage
from edgepilot.mqtt.takeover import Takeover, TakeoverGuard
from edgepilot.mqtt.topics import Topics

log = logging.getLogger(__name__)

Incoming = Callable[[str, bytes, Any], None]

# how long new messages wait behind the resumed session's unfinished handshakes at most
RESUME_BARRIER_S = 10.0


class MqttLink:
    """One paho client: connect in the background, publish through the outbox, reconnect."""

    def __init__(self, cfg: MqttSection, topics: Topics, outbox: Outbox, *,
                 loop: asyncio.AbstractEventLoop, online: Callable[[], bytes],
                 offline: bytes, on_command: Incoming,
                 on_connected: Callable[[], None] | None = None,
                 on_taken_over: Callable[[Takeover], None] | None = None,
                 window: int = 64) -> None:
        self.cfg = cfg
        self.topics = topics
        self.outbox = outbox
        self.loop = loop
        self.window = window
        self._online = online
        self._offline = offline
        self._on_command = on_command
        self._on_connected = on_connected
        self._on_taken_over = on_taken_over
        self._connected = False
        self._stopping = False
        self._pending: set[int] = set()
        self._barrier = False
        self._barrier_timer: asyncio.TimerHandle | None = None
        self._last_logged: str | None = None
        self._session_up = False  # CONNACK accepted on the current socket (paho thread)
        self._attempt_reported = False
        self._paho_error: str | None = None
        self.connects = 0
        self.resumed_sessions = 0
        # messages whose handshake a resumed session finished / a lost connection cut
        self.resumed_in_flight = self.cut_in_flight = 0
        self._rearming = False
        self._rearm_task: asyncio.Task[None] | None = None
        self.failed_connects = 0
        self.last_error: str | None = None
        self.v5 = cfg.protocol == "5"
        self.persistent = cfg.qos == 2 and self.v5
        self._armed = not self.persistent  # persistent: re-entered once with clean start off
        self.client_id = cfg.client_id or f"edgepilot-{cfg.device_id}"
        self.takeover = TakeoverGuard(self.client_id, self.v5, cfg.reconnect_max_s)
        self._backoff_task: asyncio.Task[None] | None = None
        self.client = self._make_client()

    # ---- construction -----------------------------------------------------------------------
    def _make_client(self) -> mqtt.Client:
        client = make_client(self.cfg, self.client_id, self.topics.status, self._offline)
        client.on_connect = self._cb_connect
        client.on_connect_fail = self._cb_connect_fail
        client.on_pre_connect = self._cb_pre_connect
        client.on_log = self._cb_log
        client.on_disconnect = self._cb_disconnect
        client.on_publish = self._cb_publish
        client.on_message = self._cb_message
        return client

    @property
    def connected(self) -> bool:
        return self._connected

    # ---- start and stop ---------------------------------------------------------------------
    def start(self) -> None:
        """Begin connecting in the background; returns at once (the broker may be down)."""
        self._connect_async(clean_start=True)
        self.client.loop_start()

    def _connect_async(self, clean_start: bool) -> None:
        props = None
        if self.v5:
            props = Properties(mqtt.PacketTypes.CONNECT)
            # QoS 2: a session the broker keeps while we are away
            props.SessionExpiryInterval = self.cfg.session_expiry_s if self.persistent else 0
        self.client.connect_async(
            self.cfg.host, self.cfg.port, keepalive=self.cfg.keepalive_s,
            clean_start=clean_start if self.v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=props)

    def _rearm_on_loop(self, back: list[mqtt.MQTTMessage]) -> None:
        if self._stopping:
            return
        self._take_back(back)
        self._rearm_task = asyncio.ensure_future(self._rearm())

    async def _rearm(self) -> None:
        # paho's network thread ends after the disconnect; join it, then connect again
        await asyncio.get_running_loop().run_in_executor(None, self.client.loop_stop)
        if self._stopping:
            return
        self._armed = True
        self._rearming = False
        self._connect_async(clean_start=False)
        self.client.loop_start()

    async def stop(self, offline: bytes | None = None, timeout_s: float = 3.0) -> None:
        """Flush what can be flushed, publish retained ``offline``, disconnect, stop the thread."""
        deadline = self.loop.time() + timeout_s
        while self._connected and (len(self.outbox) or self._pending) \
                and self.loop.time() < deadline:
            self.drain()
            await asyncio.sleep(0.02)
        self._stopping = True
        self._set_barrier(False)
        if self._rearm_task is not None:
            await self._rearm_task
        if self._backoff_task is not None:  # waiting after a takeover: wait no more
            self._backoff_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._backoff_task
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
        while self._connected and not self._stopping and not self._barrier \
                and len(self._pending) < self.window:
            msg = self.outbox.pop()
            if msg is None:
                return
            try:
                info = self.client.publish(msg.topic, msg.payload, qos=msg.qos,
                                           retain=msg.retain, properties=msg.properties)
            except ValueError as exc:
                # a topic paho will never publish (wildcards, oversize): drop it, not the rest
                log.warning("dropped a message paho refuses to publish to %r: %s", msg.topic, exc)
                continue
            if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                self._pending.add(info.mid)
            elif info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN and msg.qos > 0:
                # paho keeps it: sent by paho on a resumed session, else taken back; stop
                self._pending.add(info.mid)
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

    def _connected_on_loop(self, back: list[mqtt.MQTTMessage], resumed: bool) -> None:
        if self._stopping:
            return
        if resumed:
            # paho is finishing the in-flight handshakes with their packet ids; new messages
            # go only once those are acknowledged, so they cannot overtake them
            self.resumed_sessions += 1
            self.resumed_in_flight += len(self._pending)
            self._set_barrier(bool(self._pending))
        else:
            self._take_back(back)
        self.connects += 1
        self.last_error = None
        log.info("MQTT connected to %s:%d (%d queued, %d in flight%s)", self.cfg.host,
                 self.cfg.port, len(self.outbox), len(self._pending),
                 ", session resumed" if resumed else "")
        self.client.publish(self.topics.status, self._online(), qos=1, retain=True)
        # only now: "connected" means the retained online status has gone out first
        self._connected, self._last_logged = True, None
        if self._on_connected is not None:
            try:
                self._on_connected()
            except Exception:
                log.exception("MQTT on-connect hook failed")
        self.drain()

    def _taken_over_on_loop(self, taken: Takeover) -> None:
        if self._stopping:
            return
        self._take_back()  # what paho held unacknowledged goes first once back
        self.last_error = (f"session taken over by another client with client id "
                           f"{taken.client_id!r}; reconnecting in {taken.backoff_s:.1f}s")
        log.warning("%s", taken.message())
        if self._on_taken_over is not None:
            try:
                self._on_taken_over(taken)
            except Exception:
                log.exception("MQTT takeover hook failed")
        self._backoff_task = asyncio.ensure_future(self._reconnect_after(taken.backoff_s))

    async def _reconnect_after(self, delay_s: float) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.client.loop_stop)
        await asyncio.sleep(delay_s)
        if self._stopping:
            return
        self._rearming, self._backoff_task = False, None
        # a persistent session is entered again (clean start off) if the broker still has it
        self._connect_async(clean_start=not self.persistent)
        self.client.loop_start()

    def _acked_on_loop(self, mid: int) -> None:
        self._pending.discard(mid)
        if self._barrier and not self._pending:
            self._set_barrier(False)
        self.drain()

    def _set_barrier(self, on: bool) -> None:
        if self._barrier_timer is not None:
            self._barrier_timer.cancel()
            self._barrier_timer = None
        self._barrier = on
        if on:
            self._barrier_timer = self.loop.call_later(RESUME_BARRIER_S, self._barrier_expired)

    def _barrier_expired(self) -> None:
        self._barrier_timer = None
        if self._barrier:
            log.warning("%d resumed QoS 2 messages not acknowledged after %.0fs; sending the "
                        "queue anyway (order may suffer)", len(self._pending), RESUME_BARRIER_S)
            self._barrier = False
            self.drain()

    def _failed(self, why: str, level: int) -> None:
        """One connection attempt failed: count it, keep the reason, log each new reason once
        (repeats at DEBUG: paho retries with backoff forever)."""
        self.failed_connects += 1
        self.last_error = why
        log.log(level if why != self._last_logged else logging.DEBUG, "MQTT %s:%d: %s",
                self.cfg.host, self.cfg.port, why)
        self._last_logged = why

    # ---- paho callbacks (paho thread: hand off, never block) -----------------------------
    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # loop closed while the daemon exits
            self.loop.call_soon_threadsafe(fn, *args)

    def _cb_pre_connect(self, _c: mqtt.Client, _u: Any) -> None:
        self._attempt_reported = False
        self._paho_error = None

    def _cb_log(self, _c: mqtt.Client, _u: Any, level: int, buf: str) -> None:
        # paho says why a socket died only in its log (e.g. a TLS alert from the broker)
        if level == mqtt.MQTT_LOG_ERR:
            self._paho_error = buf

    def _cb_connect(self, client: mqtt.Client, _u: Any, flags: mqtt.ConnectFlags,
                    reason: ReasonCode, _p: Any) -> None:
        if reason.is_failure:
            self.takeover.connect_failed()
            self._attempt_reported = True
            self._failed(f"broker refused the connection: {reason} (check [mqtt] username, "
                         "password, client_id and the broker ACL); retrying", logging.ERROR)
            return
        if not self._armed:
            # the fresh persistent session exists now: enter it again with clean start off
            self._rearming = True
            back = client.drop_out_messages()
            client.disconnect()
            self._call_soon(self._rearm_on_loop, back)
            return
        self._session_up = True
        self.takeover.session_up()
        resumed = self.persistent and flags.session_present
        # A fresh session: take back what paho still holds before it resends it itself, so
        # the loop puts it in front of the outbox and old and new leave in one order. A resumed
        # QoS 2 session: leave it to paho, which completes each handshake with its packet id.
        back = [] if resumed else client.drop_out_messages()
        client.subscribe([(t, int(self.cfg.qos)) for t in self.topics.subscriptions()])
        self._call_soon(self._connected_on_loop, back, resumed)

    def _cb_connect_fail(self, _c: mqtt.Client, _u: Any) -> None:
        # paho calls this from inside its ``except OSError``: the exception is the reason
        exc = sys.exc_info()[1]
        self.takeover.connect_failed()
        self._failed(describe_connect_error(exc, self.cfg.reconnect_max_s), logging.WARNING)

    def _cb_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, reason: ReasonCode,
                       _p: Any) -> None:
        # a plain bool store is atomic; publishing stops at the next drain check
        self._connected = False
        was_up, self._session_up = self._session_up, False
        if self._stopping or self._rearming:
            return
        if was_up:
            taken = self.takeover.session_down(getattr(reason, "value", -1))
            if taken is not None:
                # stop paho's own reconnecting: it would take the session straight back and the
                # other client would do the same, every second
                self._rearming = True
                self.client.disconnect()
                self._call_soon(self._taken_over_on_loop, taken)
                return
            # counted on the loop, after the acks paho took before the loss (queued first)
            self._call_soon(self._count_cut)
            log.warning("MQTT connection lost (%s); buffering until the broker is back", reason)
        elif not self._attempt_reported:
            self._attempt_reported = True
            self._failed(describe_closed_early(self._paho_error or str(reason),
                                               self.cfg.tls is not None), logging.WARNING)

    def _count_cut(self) -> None:
        self.cut_in_flight += len(self._pending)

    def _cb_publish(self, _c: mqtt.Client, _u: Any, mid: int, _r: Any, _p: Any) -> None:
        self._call_soon(self._acked_on_loop, mid)

    def _cb_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        self._call_soon(self._on_command, msg.topic, bytes(msg.payload),
                        getattr(msg, "properties", None))

