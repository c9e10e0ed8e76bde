"""Commands over MQTT: ``<prefix>/<device>/cmd/<verb>`` (and group topics) in, one reply out.

The payload is the command's params as a JSON object (the same body as
``POST /v1/commands/<verb>``); two envelope keys are taken out of it first: ``id`` (request id
for clients without MQTT 5 correlation data) and ``reply_to`` (reply topic for 3.1.1 clients,
accepted only under this device's namespace). Where the reply goes: the MQTT 5 response topic,
else ``reply_to``, else ``<prefix>/<device>/reply/<verb>``. The reply carries the request's
correlation data (MQTT 5) or its ``id``.

A request id seen before gets the same reply again without running the command again (QoS 1
redelivery); ids are remembered in a bounded LRU. Oversize, non-JSON, unknown verbs and bad
fields get an error reply, and a burst of commands beyond ``MAX_INFLIGHT`` gets ``busy``.

Security: MQTT carries no bearer token, so mutating verbs (``profile.apply`` ...) are guarded by
the broker's ACL: give write access to ``<prefix>/<device>/cmd/#`` and ``<prefix>/group/#`` only to
operators, as you would give out the HTTP token.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgepilot.command_registry import CommandRegistry, reply_for
from edgepilot.errors import BusyError, CommandError, EdgepilotError, NotFoundError
from edgepilot.json_depth import MAX_DEPTH, too_deep
from edgepilot.mqtt.outbox import OutMessage
from edgepilot.mqtt.topics import Topics
from edgepilot.serving.core import Serving
from edgepilot.serving.infer_command import NPZ_CONTENT_TYPE, infer_npz

log = logging.getLogger(__name__)

MAX_INFLIGHT = 32
DEDUP_SIZE = 512
_PENDING = object()  # LRU marker: the command is still running
# Verbs whose replies are not kept for redelivery: they change nothing, so running one twice is
# harmless, and their replies (tensors) can be megabytes each.
NO_REPLAY = frozenset({"infer"})


class CommandTransport:
    """Turns command messages into registry calls and replies; runs on the daemon loop."""

    def __init__(self, commands: CommandRegistry, topics: Topics,
                 send: Callable[[OutMessage], None], *, serving: Serving | None = None,
                 qos: int, v5: bool, max_payload_bytes: int) -> None:
        """``serving``: where a binary (``.npz``) infer goes (None: refused)."""
        self.commands = commands
        self.serving = serving
        self.topics = topics
        self.send = send
        self.qos = qos
        self.v5 = v5
        self.max_payload_bytes = max_payload_bytes
        self._seen: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.handled = 0
        self.replayed = 0

    def on_message(self, topic: str, payload: bytes, properties: Any) -> None:
        """Entry point for every message on a command topic (loop thread; never raises)."""
        verb = self.topics.verb_of(topic)
        if verb is None:
            return
        response_topic: str | None = None
        correlation: bytes | None = None
        content_type: str | None = None
        if self.v5 and properties is not None:
            response_topic = getattr(properties, "ResponseTopic", None) or None
            correlation = getattr(properties, "CorrelationData", None) or None
            content_type = getattr(properties, "ContentType", None) or None
        reply_topic = response_topic or self.topics.reply(verb)
        try:
            if response_topic is not None:
                # a refused one is answered on the default reply topic instead
                reply_topic = self.topics.reply(verb)
                reply_topic = self.topics.check_response_topic(response_topic)
            if verb == "infer" and content_type == NPZ_CONTENT_TYPE:
                # the one binary command: tensors stay .npz both ways, the rest in properties
                self._start_npz(payload, properties, reply_topic, correlation)
                return
            params, req_id, reply_to = self._parse(payload)
            if reply_to is not None and response_topic is None:
                reply_topic = self.topics.check_reply_to(reply_to)
        except EdgepilotError as exc:
            self._reply(reply_topic, correlation, None, reply_for(exc=exc))
            return
        key_id = correlation.hex() if correlation is not None else req_id
        key = (reply_topic, key_id) if key_id is not None and verb not in NO_REPLAY else None
        if key is not None and key in self._seen:
            self._seen.move_to_end(key)
            cached = self._seen[key]
            if cached is not _PENDING:
                self.replayed += 1
                self._reply(reply_topic, correlation, req_id, cached)
            return  # still running: its reply is on the way
        if len(self._tasks) >= MAX_INFLIGHT:
            busy = BusyError(f"{MAX_INFLIGHT} MQTT commands are already running; retry later")
            self._reply(reply_topic, correlation, req_id, reply_for(exc=busy))
            return
        if key is not None:
            self._remember(key, _PENDING)
        task = asyncio.get_running_loop().create_task(
            self._run(verb, params, reply_topic, correlation, req_id, key),
            name=f"mqtt-cmd-{verb}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _check_size(self, payload: bytes) -> None:
        if len(payload) > self.max_payload_bytes:
            raise CommandError(f"payload of {len(payload)} bytes is over the "
                               f"{self.max_payload_bytes}-byte limit ([mqtt] max_payload_bytes)",
                               field="payload")

    def _parse(self, payload: bytes) -> tuple[Any, str | None, Any]:
        self._check_size(payload)
        deep = CommandError(f"payload is nested more than {MAX_DEPTH} levels deep; send a JSON "
                            "object of the command's params", field="payload")
        if too_deep(payload):  # an answer, not a dropped message
            raise deep
        try:
            text = payload.decode("utf-8")
            data = json.loads(text) if text.strip() else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CommandError(f"payload is not JSON: {exc}; send a JSON object of the "
                               "command's params", field="payload") from None
        except RecursionError:  # the limit reached by a parse already deep in the stack
            raise deep from None
        req_id: str | None = None
        reply_to: Any = None
        if isinstance(data, dict):
            data = dict(data)
            raw_id = data.pop("id", None)
            reply_to = data.pop("reply_to", None)
            if raw_id is not None:
                if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) \
                        or len(str(raw_id)) > 256:
                    raise CommandError("id must be a string or integer of at most 256 "
                                       "characters", field="id")
                req_id = str(raw_id)
        return data, req_id, reply_to

    def _remember(self, key: tuple[str, str], value: Any) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        while len(self._seen) > DEDUP_SIZE:
            # evict the oldest *finished* reply: a running command (at most MAX_INFLIGHT of
            # them) must stay known, or a redelivery of it would run it a second time
            oldest = next((k for k, v in self._seen.items() if v is not _PENDING), None)
            if oldest is None:
                break
            del self._seen[oldest]

    async def _run(self, verb: str, params: Any, reply_topic: str, correlation: bytes | None,
                   req_id: str | None, key: tuple[str, str] | None) -> None:
        try:
            result = await self.commands.execute(verb, params)
            body = reply_for(result)
        except Exception as exc:  # every failure becomes an error reply; the daemon goes on
            body = reply_for(exc=exc)
        self.handled += 1
        if key is not None:
            self._remember(key, body)
        self._reply(reply_topic, correlation, req_id, body)

    def _reply(self, topic: str, correlation: bytes | None, req_id: str | None,
               body: dict[str, Any]) -> None:
        out = dict(body)
        if req_id is not None:
            out["id"] = req_id
        props = None
        if self.v5:
            # the content type tells a binary (.npz) infer client an error reply from outputs
            props = Properties(PacketTypes.PUBLISH)
            props.ContentType = "application/json"
            # who answers: a group command collects many replies under one correlation
            props.UserProperty = [("device_id", self.topics.device_id)]
            if correlation is not None:
                props.CorrelationData = correlation
        try:
            payload = json.dumps(out, default=str).encode()
        except (TypeError, ValueError) as exc:
            payload = json.dumps(reply_for(exc=exc)).encode()
        self.send(OutMessage(topic=topic, payload=payload, qos=self.qos, properties=props,
                             spool=False))

    def _start_npz(self, payload: bytes, properties: Any, reply_topic: str,
                   correlation: bytes | None) -> None:
        """Start a binary ``infer`` (raises CommandError for the caller's error reply)."""
        self._check_size(payload)
        user = dict(getattr(properties, "UserProperty", None) or [])
        if len(self._tasks) >= MAX_INFLIGHT:
            busy = BusyError(f"{MAX_INFLIGHT} MQTT commands are already running; retry later")
            self._reply(reply_topic, correlation, None, reply_for(exc=busy))
            return
        task = asyncio.get_running_loop().create_task(
            self._run_npz(payload, user.get("model"), user.get("timeout_ms"), reply_topic,
                          correlation), name="mqtt-cmd-infer-npz")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_npz(self, payload: bytes, model: str | None, timeout_ms: str | None,
                       reply_topic: str, correlation: bytes | None) -> None:
        try:
            if self.serving is None:
                raise NotFoundError("models are not served by this daemon", field="model")
            body, meta = await infer_npz(self.serving, payload, model, timeout_ms)
        except Exception as exc:  # every failure becomes a (JSON) error reply
            self.handled += 1
            self._reply(reply_topic, correlation, None, reply_for(exc=exc))
            return
        self.handled += 1
        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = NPZ_CONTENT_TYPE
        if correlation is not None:
            props.CorrelationData = correlation
        props.UserProperty = list(meta.items())
        self.send(OutMessage(topic=reply_topic, payload=body, qos=self.qos, properties=props,
                             spool=False))

    async def close(self) -> None:
        """Let running commands finish their replies (bounded by the daemon's drain timeout)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5.0)
