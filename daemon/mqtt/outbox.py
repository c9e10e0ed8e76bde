"""The bounded buffer of messages waiting for the broker, optionally spooled to disk.

Oldest messages are dropped first when it is full, and counted in ``dropped``. Spooling writes
the spoolable messages (telemetry, events; not replies, whose asker is gone) to one JSON-lines
file in the state dir, replaced atomically, and reads it back on the next start.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class OutMessage:
    """One message to publish. ``properties`` are paho MQTT 5 properties (never spooled)."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = False
    properties: Any = None
    spool: bool = True


class Outbox:
    """Thread-safe FIFO with a size bound, an overflow counter and an optional spool file."""

    def __init__(self, maxlen: int, spool_path: Path | None = None) -> None:
        if maxlen < 1:
            raise ValueError("maxlen must be >= 1")
        self.maxlen = maxlen
        self.spool_path = spool_path
        self.dropped = 0
        self._q: deque[OutMessage] = deque()
        self._lock = threading.Lock()
        self._dirty = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._q)

    def _trim(self) -> None:
        while len(self._q) > self.maxlen:
            self._q.popleft()
            self.dropped += 1

    def put(self, msg: OutMessage) -> None:
        """Append; when full, drop the oldest and count it."""
        with self._lock:
            self._q.append(msg)
            self._trim()
            self._dirty = True

    def push_front(self, msgs: Iterable[OutMessage]) -> None:
        """Put messages back in front, keeping their order (taken back from the client)."""
        with self._lock:
            self._q.extendleft(reversed(list(msgs)))
            self._trim()
            self._dirty = True

    def pop(self) -> OutMessage | None:
        with self._lock:
            if not self._q:
                return None
            self._dirty = True
            return self._q.popleft()

    # ---- spool ------------------------------------------------------------------------------
    def save(self, force: bool = False) -> int:
        """Write the spoolable messages to the spool file (removed when none); return count."""
        if self.spool_path is None:
            return 0
        with self._lock:
            if not (self._dirty or force):
                return -1
            items = [m for m in self._q if m.spool]
            self._dirty = False
        path = self.spool_path
        try:
            if not items:
                path.unlink(missing_ok=True)
                return 0
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "w", encoding="ascii") as fh:
                for m in items:
                    fh.write(json.dumps({"topic": m.topic, "qos": m.qos, "retain": m.retain,
                                         "payload": base64.b64encode(m.payload).decode()}))
                    fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot spool %d MQTT messages to %s: %s", len(items), path, exc)
            return 0
        return len(items)

    def load(self) -> int:
        """Read the spool back in front of whatever is queued; return how many were read."""
        if self.spool_path is None or not self.spool_path.exists():
            return 0
        loaded: list[OutMessage] = []
        try:
            with open(self.spool_path, encoding="ascii") as fh:
                for n, line in enumerate(fh, 1):
                    try:
                        d = json.loads(line)
                        loaded.append(OutMessage(topic=str(d["topic"]), qos=int(d["qos"]),
                                                 retain=bool(d["retain"]),
                                                 payload=base64.b64decode(d["payload"])))
                    except (ValueError, KeyError, TypeError) as exc:
                        # a torn last line after a crash: keep what came before it
                        log.warning("%s line %d unreadable (%s); skipped", self.spool_path, n,
                                    exc)
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("cannot read MQTT spool %s: %s", self.spool_path, exc)
            return 0
        self.push_front(loaded)
        return len(loaded)
