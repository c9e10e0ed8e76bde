"""Topic names under ``<prefix>/<device_id>/`` and the checks on topics clients give us."""

from __future__ import annotations

from dataclasses import dataclass

from edgepilot.errors import CommandError

# topics of ours a reply must never be sent to (it would look like data or loop as a command)
_RESERVED = ("status", "telemetry", "events", "cmd")


@dataclass(frozen=True)
class Topics:
    """Every topic this device publishes to or subscribes to."""

    prefix: str
    device_id: str
    groups: tuple[str, ...] = ()

    @property
    def base(self) -> str:
        return f"{self.prefix}/{self.device_id}"

    @property
    def status(self) -> str:
        return f"{self.base}/status"

    @property
    def telemetry(self) -> str:
        return f"{self.base}/telemetry"

    @property
    def events(self) -> str:
        return f"{self.base}/events"

    def reply(self, verb: str) -> str:
        """Default reply topic when the request named none (3.1.1 without ``reply_to``)."""
        return f"{self.base}/reply/{verb}"

    def subscriptions(self) -> list[str]:
        """Command filters: this device's and every configured group's."""
        subs = [f"{self.base}/cmd/+"]
        subs += [f"{self.prefix}/group/{g}/cmd/+" for g in self.groups]
        return subs

    def verb_of(self, topic: str) -> str | None:
        """The verb of a command topic of ours, or None when the topic is not one."""
        for filt in self.subscriptions():
            head = filt[:-1]  # drop the '+'
            if topic.startswith(head):
                verb = topic[len(head):]
                if verb and "/" not in verb:
                    return verb
        return None

    def check_reply_to(self, topic: object) -> str:
        """Accept a 3.1.1 ``reply_to`` only under this device's namespace, never on our topics."""
        if not isinstance(topic, str) or not topic:
            raise CommandError("reply_to must be a non-empty topic string", field="reply_to")
        allowed = f"{self.base}/"
        if not topic.startswith(allowed) or len(topic) > 1024:
            raise CommandError(f"reply_to must be a topic under {allowed} (this device's "
                               "namespace)", field="reply_to")
        if any(c in topic for c in "+#\0"):
            raise CommandError("reply_to must not contain wildcards (+, #) or NUL",
                               field="reply_to")
        first = topic[len(allowed):].split("/", 1)[0]
        if first in _RESERVED:
            raise CommandError(f"reply_to must not be under {allowed}{first}: that topic is "
                               f"reserved; use e.g. {allowed}reply/<client>", field="reply_to")
        return topic

    def check_response_topic(self, topic: str) -> str:
        """Accept an MQTT 5 response topic: any topic name outside the edgepilot namespace
        (the client's own, governed by the broker's ACL), and inside it only this device's
        non-reserved topics, so a reply can never land on our telemetry, events or status,
        nor on another device's (or a group's) command topics."""
        if any(c in topic for c in "+#\0") or len(topic) > 1024:
            raise CommandError("the MQTT 5 response topic must be a topic name of at most "
                               "1024 characters, without wildcards (+, #) or NUL",
                               field="response_topic")
        if topic == self.prefix or topic.startswith(f"{self.prefix}/"):
            try:
                self.check_reply_to(topic)
            except CommandError as exc:
                raise CommandError(f"response topic {topic!r} refused: {exc.message}",
                                   field="response_topic") from None
        return topic
