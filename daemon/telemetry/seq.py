"""A sequence number that only ever increases, across reconnects, restarts and crashes.

The file in the state dir holds an upper bound of every number handed out: numbers are reserved
in blocks (one small fsync'd write per ``block`` numbers), and a clean stop writes the exact last
one. After a crash the next run starts above the reserved bound, so a number is never reused; the
cost is a jump of at most ``block``, which a consumer sees as a gap it can tell from loss because
the daemon also restarted (``status`` uptime).

The number last handed out is also written, without fsync, to a second file: the reserved bound
is no count an operator can compare with what telemetry published (``doctor`` reads this one).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

SEQ_FILE = "telemetry.seq"  # in the state dir
LAST_SEQ_FILE = SEQ_FILE + ".last"  # the last number handed out, for doctor


class PersistentSeq:
    """Thread-safe strictly increasing counter persisted at ``path``."""

    def __init__(self, path: Path, block: int = 1000) -> None:
        if block < 1:
            raise ValueError("block must be >= 1")
        self.path = path
        self.last_path = path.with_name(path.name + ".last")
        self.block = block
        self._lock = threading.Lock()
        self._last = self._load()
        self._reserved = self._last

    def _load(self) -> int:
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            return self._recover(f"cannot read {self.path}: {exc}")
        try:
            value = int(text)
        except ValueError:
            return self._recover(f"{self.path} does not hold an integer ({text[:40]!r})")
        if value < 0:
            return self._recover(f"{self.path} holds a negative number")
        return value

    def _recover(self, why: str) -> int:
        # Milliseconds since the epoch are above any count a daemon can have reached, so
        # restarting from there keeps the sequence increasing even though the file is lost.
        start = int(time.time() * 1000)
        log.warning("%s; telemetry seq continues from %d so it still only increases", why, start)
        return start

    def _write(self, value: int, path: Path | None = None, sync: bool = True) -> None:
        path = path or self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(f"{value}\n")
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)

    @property
    def last(self) -> int:
        """The last number handed out (0 before the first ever)."""
        with self._lock:
            return self._last

    def next(self) -> int:
        """Hand out the next number, reserving a new block on disk when needed."""
        with self._lock:
            self._last += 1
            if self._last > self._reserved:
                reserved = self._last + self.block - 1
                try:
                    self._write(reserved)
                    self._reserved = reserved
                except OSError as exc:
                    # still correct for this run; a crash before the next good write could
                    # reuse numbers, which the warning tells the operator
                    log.warning("cannot persist telemetry seq to %s: %s", self.path, exc)
            # informational only; the reservation above is what keeps seq increasing
            with contextlib.suppress(OSError):
                self._write(self._last, self.last_path, sync=False)
            return self._last

    def close(self) -> None:
        """Clean stop: record the exact last number so the next run continues right after it."""
        with self._lock:
            try:
                self._write(self._last)
                self._reserved = self._last
            except OSError as exc:
                log.warning("cannot persist telemetry seq to %s: %s", self.path, exc)
