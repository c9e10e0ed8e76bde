"""The DVFS journal: what the board looked like before we touched it, persisted (fsync'd).

Written before the first write of a transaction; completed once the profile is fully applied;
removed after a restore. A journal found at start-up means a crash: restore from it first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgepilot.errors import BoardError

JOURNAL_NAME = "dvfs-journal.json"
LOCK_NAME = "dvfs.lock"


@dataclass
class Journal:
    """``original``: board path -> exact text before edgepilot's first write (kept across
    profile switches). ``applied``: the texts after the last complete apply (None while a
    transaction is in flight). Tool state: nvpmodel mode before, jetson_clocks store file and
    whether the active profile holds the jetson_clocks lock."""

    sysfs_root: str
    profile: str | None = None
    pid: int = field(default_factory=os.getpid)
    started: float = field(default_factory=time.time)
    original: dict[str, str] = field(default_factory=dict)
    applied: dict[str, str] | None = None
    nvpmodel_before: int | None = None
    jetson_clocks_store: str | None = None
    jetson_clocks_locked: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def journal_path(state_dir: Path) -> Path:
    return Path(state_dir) / JOURNAL_NAME


def save(state_dir: Path, journal: Journal) -> None:
    """Atomically replace the journal: write a temp file, fsync it, rename, fsync the dir."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    target = journal_path(state_dir)
    tmp = target.with_suffix(".tmp")
    data = json.dumps(journal.as_dict(), indent=1, sort_keys=True).encode()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        dfd = os.open(state_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise BoardError(f"cannot write the DVFS journal {target}: {exc.strerror}; nothing was "
                         "changed (check [daemon] state_dir permissions)",
                         field="state_dir") from None


def load(state_dir: Path) -> Journal | None:
    """The journal left in ``state_dir``, or None. A corrupt one is an error, not ignored."""
    path = journal_path(state_dir)
    try:
        raw = json.loads(path.read_text())
        journal = Journal(**raw)
        _check_types(journal)
        return journal
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise BoardError(f"state dir {state_dir} is not a directory; point --state-dir or "
                         "[daemon] state_dir at one", field="state_dir") from None
    except (OSError, ValueError, TypeError) as exc:
        raise BoardError(f"the DVFS journal {path} is unreadable ({exc}); inspect it, restore the "
                         "clocks by hand and delete it", field="state_dir") from None


def _texts(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in value.items())


def _check_types(j: Journal) -> None:
    """A journal whose fields have the wrong shape (hand-edited, another version) is refused
    here, not half-way through a restore."""
    bad = [name for name, ok in (
        ("sysfs_root", isinstance(j.sysfs_root, str)),
        ("profile", j.profile is None or isinstance(j.profile, str)),
        ("original", _texts(j.original)),
        ("applied", j.applied is None or _texts(j.applied)),
        ("nvpmodel_before", j.nvpmodel_before is None or (isinstance(j.nvpmodel_before, int)
                                                          and not isinstance(j.nvpmodel_before,
                                                                             bool))),
        ("jetson_clocks_store", j.jetson_clocks_store is None
         or isinstance(j.jetson_clocks_store, str)),
        ("jetson_clocks_locked", isinstance(j.jetson_clocks_locked, bool)),
    ) if not ok]
    if bad:
        raise ValueError(f"field(s) {', '.join(bad)} have the wrong type")


def remove(state_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        journal_path(state_dir).unlink()


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Serialise DVFS transactions between processes (daemon and CLI) sharing a state dir."""
    state_dir = Path(state_dir)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise BoardError(f"state dir {state_dir} cannot hold the DVFS lock and journal "
                         f"({exc.strerror}); point --state-dir or [daemon] state_dir at a "
                         "writable directory; nothing was changed", field="state_dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
