"""systemd notify protocol (sd_notify(3)) over ``$NOTIFY_SOCKET``.

The protocol is one datagram of ``KEY=VALUE`` lines to a unix socket (``@`` = abstract namespace);
it is small enough that a dependency would add more surface than it removes.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    """Sends notifications when running under systemd (or a test that sets NOTIFY_SOCKET)."""

    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._sock: socket.socket | None = None
        self._addr: str | bytes | None = None
        if address:
            self._addr = "\0" + address[1:] if address.startswith("@") else address
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, *lines: str) -> bool:
        if self._sock is None or self._addr is None:
            return False
        try:
            self._sock.sendto("\n".join(lines).encode(), self._addr)
            return True
        except OSError as exc:  # systemd gone or socket full: never fatal
            log.debug("sd_notify failed: %s", exc)
            return False

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval_s() -> float | None:
    """Half of ``$WATCHDOG_USEC`` (when it is meant for this process), else None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2e6 if value > 0 else None
