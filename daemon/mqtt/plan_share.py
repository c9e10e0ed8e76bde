"""Plans shared between identical boards, over the broker: retained QoS 1 messages on
``<prefix>/fleet/plans/<fingerprint>/<model sha256>/<signature>``.

The daemon subscribes to its own fingerprint's plans only, on every connect and again when a
DVFS profile change moves its fingerprint; the retained ones arrive at once and go to the
:class:`~edgepilot.dispatch.planning.shared.PlanExchange`, which checks them. Plans this board
measured are published retained, so boards that come later find them. The broker's ACL decides
who may publish there (README: "Plans shared between identical boards").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from edgepilot.blocking import RunBlocking
from edgepilot.dispatch.planning.shared import PlanExchange
from edgepilot.mqtt.link import MqttLink
from edgepilot.mqtt.outbox import OutMessage

log = logging.getLogger(__name__)

# after SUBACK the broker sends the retained plans at once; planning waits this long for them
SETTLE_S = 0.5


class PlanShare:
    """The MQTT side of a :class:`PlanExchange`; runs on the daemon loop."""

    def __init__(self, exchange: PlanExchange, prefix: str, *,
                 parts: Callable[[], Mapping[str, Any]], run_blocking: RunBlocking,
                 max_bytes: int = 4 * 1024 * 1024) -> None:
        """``parts``: what the board's fingerprint is computed from now (the dispatcher's key
        parts: DVFS profile, runtimes), read off the loop; ``max_bytes``: the largest plan
        message read (``[mqtt] max_payload_bytes``; it is parsed on the loop)."""
        self.max_bytes = max_bytes
        self.exchange = exchange
        self.base = f"{prefix}/fleet/plans"
        self.parts = parts
        self.run_blocking = run_blocking
        self.fingerprint: str | None = None
        self._link: MqttLink | None = None
        self._subscribed: str | None = None
        self._settle: asyncio.TimerHandle | None = None

    def attach(self, link: MqttLink) -> None:
        """Publish this board's plans through ``link`` from now on."""
        self._link = link
        self.exchange.connect(self._publish)

    def detach(self) -> None:
        """The link is going away: plans made meanwhile are kept here, not published."""
        self.exchange.connect(None)
        self._link, self._subscribed = None, None
        if self._settle is not None:
            self._settle.cancel()
        self.exchange.ready.clear()
        self.exchange.subscribing = False

    def _fingerprint(self) -> str:
        return self.exchange.fingerprint_of(self.parts())

    async def refresh(self) -> bool:
        """Subscribe to this board's fingerprint (on connect, after a profile change); True
        when the fingerprint changed."""
        fp = await self.run_blocking(self._fingerprint)
        changed, self.fingerprint = fp != self.fingerprint, fp
        link = self._link
        if link is None or not link.connected:
            return changed
        topic = f"{self.base}/{fp}/#"
        if self._subscribed is not None and self._subscribed != topic:
            link.client.unsubscribe(self._subscribed)
            self.exchange.ready.clear()
        # again on every connect: a clean session lost it (a kept one gets the retained again)
        link.client.subscribe(topic, qos=1)
        self._subscribed = topic
        if self._settle is not None:
            self._settle.cancel()
        self.exchange.subscribing = True
        self._settle = asyncio.get_running_loop().call_later(SETTLE_S, self._settled)
        log.info("sharing plans under %s/%s/", self.base, fp)
        return changed

    def _settled(self) -> None:
        self.exchange.ready.set()
        self.exchange.subscribing = False

    def on_message(self, topic: str, payload: bytes) -> bool:
        """A message under the shared plans (True: handled here, whatever it held)."""
        if not topic.startswith(f"{self.base}/"):
            return False
        levels = topic[len(self.base) + 1:].split("/")
        if len(levels) != 3 or not all(levels):
            self.exchange.reject(topic, "not a plan topic: <prefix>/fleet/plans/<fingerprint>/"
                                        "<model sha256>/<signature>")
            return True
        if len(payload) > self.max_bytes:
            self.exchange.reject(topic, f"{len(payload)} bytes, over the {self.max_bytes}-byte "
                                        "limit ([mqtt] max_payload_bytes)")
            return True
        self.exchange.offer(topic, levels[0], levels[1], levels[2], payload)
        return True

    def _publish(self, suffix: str, payload: bytes) -> None:
        # the planning thread: the link queues it on the loop (buffered while the broker is away)
        link = self._link
        if link is not None:
            link.send_threadsafe(OutMessage(f"{self.base}/{suffix}", payload, qos=1, retain=True,
                                            spool=False))
