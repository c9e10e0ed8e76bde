"""Telling a session taken over by another client apart from a lost connection.

Two daemons configured with the same MQTT client id (a copied config, a cloned SD card) take
the one session from each other: the broker drops the older connection each time the other
connects. Reconnecting at once, as for a lost link, makes both fight over it every second.

- MQTT 5: a broker may say so, DISCONNECT reason code 142 "Session taken over".
- Otherwise (MQTT 3.1.1, and MQTT 5 brokers that just close the socket, as mosquitto 2.0.11
  does) several sessions in a row that end within :data:`SHORT_SESSION_S` of being accepted,
  each reconnect accepted at once, are taken as a takeover; a failed connect in between (a
  broker restarting) breaks the row.

A taken-over link backs off instead: ``reconnect_max_s`` after the first takeover, doubling
with each one in a row up to :data:`MAX_BACKOFF_S`; a session then held well past the wait
before it (three times as long) ends the streak.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# the MQTT 5 DISCONNECT reason code a broker sends to the client whose session another took
SESSION_TAKEN_OVER = 142
# MQTT 3.1.1: a session that ended this soon after CONNACK counts as cut short ...
SHORT_SESSION_S = 5.0
# ... and this many in a row as a takeover
SHORT_SESSIONS_IN_A_ROW = 3
MAX_BACKOFF_S = 3600.0


@dataclass(frozen=True)
class Takeover:
    """One takeover: who lost the session, how it was told, and how long the link waits."""

    client_id: str
    streak: int
    backoff_s: float
    detected_by: str  # "reason_code_142" or "short_sessions"

    def message(self) -> str:
        how = ("the broker said 'Session taken over'" if self.detected_by == "reason_code_142"
               else f"{self.streak * SHORT_SESSIONS_IN_A_ROW} sessions in a row closed within "
                    f"{SHORT_SESSION_S:.0f}s of connecting")
        return (f"MQTT session of client id {self.client_id!r} taken over by another client "
                f"with the same client id ({how}); two daemons share [mqtt] client_id / "
                f"device_id? not fighting over it: reconnecting in {self.backoff_s:.1f}s")

    def fields(self) -> dict[str, object]:
        """The ``mqtt.session_taken_over`` event's fields."""
        return {"client_id": self.client_id, "streak": self.streak,
                "backoff_s": self.backoff_s, "detected_by": self.detected_by}


class TakeoverGuard:
    """Per link: sees each end of an accepted session and says when it was a takeover.

    Called on paho's network thread only (connect and disconnect callbacks), so it needs no
    lock of its own.
    """

    def __init__(self, client_id: str, v5: bool, base_backoff_s: float) -> None:
        self.client_id = client_id
        self.v5 = v5
        self.base_backoff_s = max(0.05, base_backoff_s)
        self.total = 0  # takeovers since start
        self._streak = 0
        self._short = 0
        self._up_since: float | None = None
        self._last_backoff_s = 0.0

    def session_up(self) -> None:
        """CONNACK accepted."""
        self._up_since = time.monotonic()

    def connect_failed(self) -> None:
        """A connect attempt failed (refused, unreachable): the broker was away, as when it
        restarts, so the short sessions before were not another client's doing."""
        self._short = 0

    def session_down(self, reason_value: int) -> Takeover | None:
        """An accepted session ended with ``reason_value``; a :class:`Takeover` when that was
        another client taking it."""
        held = time.monotonic() - self._up_since if self._up_since is not None else 0.0
        self._up_since = None
        if held > max(3 * self._last_backoff_s, SHORT_SESSION_S):
            # held well past the last wait (while two fight, each holds it about as long as
            # the other waits, at most twice our own wait): whatever fought over it is gone
            self._streak = 0
        detected_by: str | None = None
        if self.v5 and reason_value == SESSION_TAKEN_OVER:
            detected_by = "reason_code_142"
        elif held < SHORT_SESSION_S:
            self._short += 1
            if self._short >= SHORT_SESSIONS_IN_A_ROW:
                detected_by = "short_sessions"
        else:
            self._short = 0
        if detected_by is None:
            return None
        self._short = 0
        self._streak += 1
        self.total += 1
        self._last_backoff_s = min(MAX_BACKOFF_S,
                                   self.base_backoff_s * 2 ** (self._streak - 1))
        return Takeover(self.client_id, self._streak, self._last_backoff_s, detected_by)
