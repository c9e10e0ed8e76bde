"""Reads and allow-listed writes below one sysfs root.

Everything the board layer touches goes through :class:`Sysfs`, so the same code reads a real
board (root ``/``) and a fake tree under ``tmp_path``. Reads never raise: files that fail in
normal operation (EAGAIN on power-gated thermal zones, EBUSY on an offline cpufreq policy,
missing files) read as ``None``. Writes are refused unless the resolved path stays below the root
and the file name is one a DVFS profile may set.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from edgepilot.errors import BoardError

log = logging.getLogger(__name__)

# File names a profile may write (cpufreq, devfreq, CPU hotplug). Nothing else is ever written.
WRITABLE_NAMES: frozenset[str] = frozenset({
    "scaling_governor", "scaling_min_freq", "scaling_max_freq", "scaling_setspeed",
    "governor", "min_freq", "max_freq", "online",
})

_MAX_READ = 1 << 16


class Sysfs:
    """A sysfs/procfs tree rooted at ``root`` (``/`` on a real board)."""

    def __init__(self, root: Path | str = "/") -> None:
        # resolved once, so paths found through /sys/class symlinks map back below it
        self.root = Path(os.path.realpath(root))
        self._real_root = str(self.root)

    def path(self, abspath: str) -> Path:
        """Map an absolute board path (``/sys/...``) to the path below this root."""
        return self.root / abspath.lstrip("/")

    def rel(self, path: Path | str) -> str:
        """The board path (``/sys/...``) of a path below this root."""
        p = Path(path)
        try:
            return "/" + str(p.relative_to(self.root))
        except ValueError:
            return str(p)

    # ---- reads ----------------------------------------------------------------------------------
    def read_bytes(self, path: Path | str) -> bytes | None:
        """Raw contents, or None when the file is missing or its read fails (EAGAIN, EBUSY...).

        O_NONBLOCK keeps a read from hanging on anything FIFO-like; on sysfs it changes nothing.
        """
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            self._note(path, exc)
            return None
        try:
            chunks = []
            while True:
                chunk = os.read(fd, _MAX_READ)
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks)
        except OSError as exc:
            self._note(path, exc)
            return None
        finally:
            os.close(fd)

    def read_text(self, path: Path | str) -> str | None:
        """Exact text of a file (newline kept), None when unreadable or empty-by-failure."""
        data = self.read_bytes(path)
        if data is None:
            return None
        return data.decode("utf-8", errors="replace")

    def read_str(self, path: Path | str) -> str | None:
        """Stripped text; None when unreadable or empty (an EOF-only read is no value)."""
        text = self.read_text(path)
        if text is None:
            return None
        text = text.strip().strip("\x00").strip()
        return text or None

    def read_int(self, path: Path | str) -> int | None:
        text = self.read_str(path)
        if text is None:
            return None
        try:
            return int(text.split()[0])
        except ValueError:
            return None

    def read_words(self, path: Path | str) -> list[str] | None:
        text = self.read_str(path)
        return None if text is None else text.split()

    def read_ints(self, path: Path | str) -> list[int] | None:
        words = self.read_words(path)
        if words is None:
            return None
        try:
            return [int(w) for w in words]
        except ValueError:
            return None

    def _note(self, path: Path | str, exc: OSError) -> None:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            log.debug("read of %s failed: %s", path, exc)

    # ---- writes ---------------------------------------------------------------------------------
    def check_writable_path(self, path: Path | str) -> str:
        """Refuse paths outside the root or with a name not on the allow-list; return realpath."""
        name = os.path.basename(path)
        if name not in WRITABLE_NAMES:
            raise BoardError(f"refusing to write {self.rel(path)}: only "
                             f"{', '.join(sorted(WRITABLE_NAMES))} may be written",
                             field=self.rel(path))
        real = os.path.realpath(path)
        if os.path.commonpath([real, self._real_root]) != self._real_root:
            raise BoardError(f"refusing to write {self.rel(path)}: it resolves to {real}, outside "
                             f"the sysfs root {self.root}", field=self.rel(path))
        if not os.path.isfile(real):
            # sysfs attributes are regular files; anything else is not a knob we understand
            raise BoardError(f"refusing to write {self.rel(path)}: not a regular sysfs file "
                             "(missing, or the device is offline)", field=self.rel(path))
        return real

    def write_text(self, path: Path | str, text: str) -> None:
        """Write ``text`` to an allow-listed file; raise BoardError naming file and value."""
        real = self.check_writable_path(path)
        data = text.encode()
        try:
            # O_TRUNC matters for plain files (fake trees); sysfs ignores it.
            fd = os.open(real, os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK)
            try:
                written = os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            raise BoardError(
                f"writing {text.strip()!r} to {self.rel(path)} failed: "
                f"{errno.errorcode.get(exc.errno or 0, exc.errno)} ({exc.strerror}); check that "
                "edgepilot runs as root and nothing else holds the file", field=self.rel(path),
            ) from None
        if written != len(data):
            raise BoardError(f"short write of {text.strip()!r} to {self.rel(path)}",
                             field=self.rel(path))

    def is_writable(self, path: Path | str) -> bool:
        """Whether this process could open the file for writing (checked, nothing written)."""
        try:
            self.check_writable_path(path)
        except BoardError:
            return False
        return os.path.isfile(path) and os.access(path, os.W_OK)
