"""Attach point of MQTT: telemetry, events and status out; commands in (see link, commands).

:class:`MqttService` is the service. Topics live under ``<prefix>/<device_id>/``:
``status`` (retained; ``offline`` is the last will), ``telemetry``, ``events``, ``cmd/<verb>`` and
``reply/<verb>``; fleet commands on ``<prefix>/group/<group>/cmd/<verb>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from edgepilot import __version__
from edgepilot.blocking import RunBlocking
from edgepilot.command_registry import CommandRegistry
from edgepilot.config import Config
from edgepilot.dispatch.planning.shared import PlanExchange
from edgepilot.events import Event, EventBus
from edgepilot.mqtt.commands import CommandTransport
from edgepilot.mqtt.discovery import Discovery
from edgepilot.mqtt.link import MqttLink
from edgepilot.mqtt.outbox import Outbox, OutMessage
from edgepilot.mqtt.plan_share import PlanShare
from edgepilot.mqtt.state_report import SPOOL_FILE
from edgepilot.mqtt.takeover import Takeover
from edgepilot.mqtt.topics import Topics
from edgepilot.serving.core import Serving
from edgepilot.telemetry.sampler import TelemetrySampler

log = logging.getLogger(__name__)

SPOOL_PERIOD_S = 1.0  # how stale the spool file may get (written only when the buffer changed)
# events after which the retained status is refreshed (it carries profile, backends)
_STATUS_EVENTS = ("profile.", "model.", "config.reloaded")


class MqttService:
    """A Service owning the broker link, the outbox and the command transport."""

    name = "mqtt"

    def __init__(self, config: Config, *, events: EventBus, commands: CommandRegistry,
                 serving: Serving | None, status: Callable[[], dict[str, Any]],
                 telemetry: TelemetrySampler | None, run_blocking: RunBlocking,
                 plans: PlanShare | None = None) -> None:
        """``status()``: the retained status's fields; ``serving``: binary ``infer``'s;
        ``plans``: plans shared with identical boards (None: not shared)."""
        self.plans = plans
        self._plan_task: asyncio.Task[None] | None = None
        self.events = events
        self.commands = commands
        self.serving = serving
        self.status = status
        self.telemetry = telemetry
        self.run_blocking = run_blocking
        self._setup(config)

    def _setup(self, config: Config) -> None:
        cfg = config.mqtt
        self.cfg = cfg
        self.topics = Topics(cfg.topic_prefix, cfg.device_id, tuple(cfg.groups))
        spool = config.state_dir / SPOOL_FILE if cfg.spool else None
        self.outbox = Outbox(cfg.buffer_size, spool)
        self.discovery = Discovery(self.topics, cfg.homeassistant_prefix, cfg.qos)
        self.link: MqttLink | None = None
        self.transport: CommandTransport | None = None
        self._spool_task: asyncio.Task[None] | None = None

    # ---- payloads ---------------------------------------------------------------------------
    def _offline(self, reason: str) -> bytes:
        # groups: `edgepilot fleet run --group` names a stopped member as not answering
        return json.dumps({"state": "offline", "device_id": self.cfg.device_id,
                           "version": __version__, "reason": reason,
                           "groups": list(self.cfg.groups)}).encode()

    def status_payload(self) -> bytes:
        """The retained ``online`` status: the status snapshot plus state and device id."""
        try:
            snap = self.status()
        except Exception:  # a half-started component must not keep us from saying "online"
            log.exception("status snapshot failed; publishing a minimal status")
            snap = {"version": __version__}
        snap.update(state="online", device_id=self.cfg.device_id, ts=round(time.time(), 3))
        if self.plans is not None:
            snap["fleet"] = {"fingerprint": self.plans.fingerprint, "share_plans": True}
        # what `edgepilot fleet ls` lists from the broker alone
        snap["groups"] = list(self.cfg.groups)
        latest = self.telemetry.latest() if self.telemetry is not None else {}
        snap["power_w"] = latest.get("power_w")
        if self.serving is not None:
            snap["models"] = sorted(self.serving.registry.loaded)
        return json.dumps(snap, default=str).encode()

    def stats(self) -> dict[str, Any]:
        """Fields merged into every telemetry report."""
        link = self.link
        connected = bool(link is not None and link.connected)
        out: dict[str, Any] = {"dropped": self.outbox.dropped, "buffered": len(self.outbox),
                               "mqtt_connected": connected}
        if link is not None and not connected and link.last_error:
            out["mqtt_error"] = link.last_error  # why it is not connected, for the operator
        return out

    # ---- producers --------------------------------------------------------------------------
    def _on_report(self, report: dict[str, Any]) -> None:
        if self.link is None:
            return
        self.link.send(OutMessage(self.topics.telemetry, json.dumps(report, default=str).encode(),
                                  qos=self.cfg.qos))
        if self.cfg.homeassistant_discovery:
            for msg in self.discovery.messages(report):
                self.link.send(msg)

    def _on_event(self, event: Event) -> None:
        link = self.link
        if link is None:
            return
        link.send_threadsafe(OutMessage(self.topics.events,
                                        json.dumps(event, default=str).encode(), qos=self.cfg.qos))
        if str(event.get("type", "")).startswith(_STATUS_EVENTS):
            link.loop.call_soon_threadsafe(self._refresh_status)
        if self.plans is not None and str(event.get("type", "")).startswith("profile."):
            link.loop.call_soon_threadsafe(self._refresh_plans)  # the fingerprint may move

    def _refresh_plans(self) -> None:
        if self.plans is not None and self.link is not None:
            self._plan_task = asyncio.ensure_future(self._resubscribe_plans(self.plans))

    async def _resubscribe_plans(self, plans: PlanShare) -> None:
        try:
            if await plans.refresh():
                self._refresh_status()  # the retained status names the fingerprint
        except Exception:  # a board read failing must not take MQTT down
            log.exception("subscribing to the shared plans failed")

    def _on_message(self, topic: str, payload: bytes, properties: Any) -> None:
        if self.plans is not None and self.plans.on_message(topic, payload):
            return
        if self.transport is not None:
            self.transport.on_message(topic, payload, properties)

    def _refresh_status(self) -> None:
        if self.link is not None and self.link.connected:
            self.link.send(OutMessage(self.topics.status, self.status_payload(), qos=1,
                                      retain=True, spool=False))

    def _on_connected(self) -> None:
        self.discovery.reset()
        self._refresh_plans()
        telemetry = self.telemetry
        if self.cfg.homeassistant_discovery and telemetry is not None and self.link is not None:
            for msg in self.discovery.messages(telemetry.snapshot()):
                self.link.send(msg)

    def _on_taken_over(self, taken: Takeover) -> None:
        # queued like any event: it reaches the bus once this daemon holds the session again
        self.events.emit("mqtt.session_taken_over", **taken.fields())

    def _send(self, msg: OutMessage) -> None:
        if self.link is not None:
            self.link.send(msg)

    # ---- service ----------------------------------------------------------------------------
    async def start(self) -> None:
        await self._start(load_spool=True)

    async def _start(self, load_spool: bool) -> None:
        if not self.cfg.enabled:
            log.info("MQTT disabled ([mqtt] enabled = false)")
            return
        loop = asyncio.get_running_loop()
        if load_spool:
            restored = await self.run_blocking(self.outbox.load)
            if restored:
                log.info("restored %d spooled MQTT messages", restored)
        self.transport = CommandTransport(self.commands, self.topics, self._send,
                                          serving=self.serving, qos=self.cfg.qos,
                                          v5=self.cfg.protocol == "5",
                                          max_payload_bytes=self.cfg.max_payload_bytes)
        self.link = MqttLink(self.cfg, self.topics, self.outbox, loop=loop,
                             online=self.status_payload, offline=self._offline("connection lost"),
                             on_command=self._on_message,
                             on_connected=self._on_connected,
                             on_taken_over=self._on_taken_over)
        self.events.subscribe(self._on_event)
        if self.plans is not None:
            self.plans.attach(self.link)
        self.link.start()
        if self.outbox.spool_path is not None:
            self._spool_task = asyncio.create_task(self._spool_loop(), name="mqtt-spool")
        log.info("MQTT to %s:%d as %s (MQTT %s), topics under %s/", self.cfg.host, self.cfg.port,
                 self.cfg.device_id, self.cfg.protocol, self.topics.base)

    async def stop(self) -> None:
        await self._stop_link()
        if self.outbox.spool_path is not None:
            saved = await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.outbox.save(force=True))
            if saved:
                log.info("spooled %d unsent MQTT messages to %s", saved, self.outbox.spool_path)

    async def _stop_link(self) -> None:
        self.events.unsubscribe(self._on_event)
        if self._spool_task is not None:
            self._spool_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._spool_task
            self._spool_task = None
        if self.plans is not None:
            self.plans.detach()
        if self._plan_task is not None:
            self._plan_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._plan_task
        if self.transport is not None:
            await self.transport.close()
        if self.link is not None:
            await self.link.stop(self._offline("stopped"))
            self.link = None

    async def reload(self, old: Config, new: Config) -> None:
        """A changed ``[mqtt]`` section reconnects with the new settings; the buffer is kept."""
        if old.mqtt == new.mqtt:
            return
        log.info("[mqtt] changed; reconnecting")
        pending = self.outbox
        await self._stop_link()
        self._setup(new)
        self.outbox.push_front(_drain_all(pending))
        self.outbox.dropped = pending.dropped
        await self._start(load_spool=False)

    async def _spool_loop(self) -> None:
        # keep the spool file close to the buffer so a crash loses little; it is rewritten only
        # when the buffer changed, and removed once the buffer is empty again
        while True:
            await asyncio.sleep(SPOOL_PERIOD_S)
            await self.run_blocking(self.outbox.save)


def _drain_all(outbox: Outbox) -> list[OutMessage]:
    out = []
    while (msg := outbox.pop()) is not None:
        out.append(msg)
    return out


def attach(config: Config, *, events: EventBus, commands: CommandRegistry,
           serving: Serving | None, status: Callable[[], dict[str, Any]],
           telemetry: TelemetrySampler | None, run_blocking: RunBlocking,
           plan_exchange: PlanExchange | None = None,
           plan_parts: Callable[[], Mapping[str, Any]] | None = None) -> MqttService:
    """Build the MQTT service and feed it every telemetry report (and its link's state into
    them); with ``plan_exchange``, plans are shared with identical boards over the broker
    (``plan_parts``: what the board's fingerprint is computed from, the dispatcher's)."""
    plans = None
    if plan_exchange is not None and plan_parts is not None:
        plans = PlanShare(plan_exchange, config.mqtt.topic_prefix, parts=plan_parts,
                          run_blocking=run_blocking, max_bytes=config.mqtt.max_payload_bytes)
    service = MqttService(config, events=events, commands=commands, serving=serving,
                          status=status, telemetry=telemetry, run_blocking=run_blocking,
                          plans=plans)
    if telemetry is not None:
        telemetry.add_listener(service._on_report)
        telemetry.add_extra(service.stats)
    return service
