"""In-process event bus: components emit events, transports (MQTT, logs) subscribe.

Events are plain dicts ``{"type": ..., "ts": ..., **fields}``. Kinds in use: profile.applied,
profile.restored, profile.conflict, model.loaded, model.unloaded, plan.changed, backend.fault,
thermal. Subscribers must not block; they are called synchronously on the emitting thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Event = dict[str, Any]
Subscriber = Callable[[Event], None]


class EventBus:
    def __init__(self, history: int = 200) -> None:
        self._subs: list[Subscriber] = []
        self._lock = threading.Lock()
        self._recent: list[Event] = []
        self._history = history

    def subscribe(self, fn: Subscriber) -> None:
        with self._lock:
            self._subs.append(fn)

    def unsubscribe(self, fn: Subscriber) -> None:
        with self._lock:
            if fn in self._subs:
                self._subs.remove(fn)

    def emit(self, kind: str, **fields: Any) -> Event:
        event: Event = {"type": kind, "ts": time.time(), **fields}
        with self._lock:
            subs = list(self._subs)
            self._recent.append(event)
            del self._recent[: -self._history]
        log.info("event %s %s", kind, fields)
        for fn in subs:
            try:
                fn(event)
            except Exception:  # a broken subscriber must not break the emitter
                log.exception("event subscriber failed for %s", kind)
        return event

    def recent(self) -> list[Event]:
        with self._lock:
            return list(self._recent)
