"""Fake board trees built from the snapshots in tests/boards/*.json (exact copies of the shared
ones), plus helpers to compare trees byte for byte.

How unreadable files are made (``_read_errors``): each becomes a FIFO whose write end the
:class:`FakeBoard` keeps open. A non-blocking read of such a FIFO fails with a real EAGAIN from
the kernel, exactly what a power-gated Orin cv*-thermal zone returns; the board layer treats every
OSError on read alike, so this also stands for EBUSY on an offline policy. (chmod 000 cannot do
it: tests may run as root, and root reads through any mode bits.)

How a write failure is injected (:func:`make_unwritable`): as root, ``chattr +i`` (immutable:
even root gets EPERM on open for write); as a normal user, ``chmod 0444``. Both fail at the OS
level, not in our code. :meth:`FakeBoard.close` undoes them so pytest can clean up.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BOARDS_DIR = Path(__file__).parent / "boards"
BIN_DIR = Path(__file__).parent / "bin"
BOARD_FILES = {
    "orin": "jetson_orin_nx_16gb.json",
    "sm8650": "qcom_sm8650.json",
    "mt6989": "mediatek_mt6989.json",
    "rpi5": "raspberrypi_5.json",
}
ALL_BOARDS = list(BOARD_FILES)


def load_snapshot(board: str) -> dict[str, Any]:
    with open(BOARDS_DIR / BOARD_FILES[board], encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


class FakeBoard:
    """A fake sysfs/procfs tree under ``root``; keep it open while the test reads it."""

    def __init__(self, root: Path, snapshot: dict[str, Any]) -> None:
        self.root = root
        self.snapshot = snapshot
        self._fifo_fds: list[int] = []
        self._immutable: list[Path] = []
        self._readonly: list[Path] = []

    def path(self, abspath: str) -> Path:
        return self.root / abspath.lstrip("/")

    def read(self, abspath: str) -> str:
        return self.path(abspath).read_text()

    def write(self, abspath: str, text: str) -> None:
        p = self.path(abspath)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text.encode())

    def make_read_error(self, abspath: str) -> None:
        """Turn a file into one whose read fails with EAGAIN (see module docstring)."""
        p = self.path(abspath)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() or p.is_symlink():
            p.unlink()
        os.mkfifo(p)
        self._fifo_fds.append(os.open(p, os.O_RDWR | os.O_NONBLOCK))

    def make_unwritable(self, abspath: str) -> None:
        """Make a file reject writes at the OS level, for root too (see module docstring)."""
        p = self.path(abspath)
        if os.geteuid() == 0:
            subprocess.run(["chattr", "+i", str(p)], check=True, timeout=30)
            self._immutable.append(p)
        else:
            p.chmod(0o444)
            self._readonly.append(p)

    def files(self) -> dict[str, bytes | str]:
        """Every entry below the root: regular files -> bytes, links -> 'link:target', FIFOs."""
        out: dict[str, bytes | str] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                full = Path(dirpath) / name
                rel = "/" + str(full.relative_to(self.root))
                mode = os.lstat(full).st_mode
                if stat.S_ISLNK(mode):
                    out[rel] = "link:" + os.readlink(full)
                elif stat.S_ISFIFO(mode):
                    out[rel] = "fifo"
                elif stat.S_ISREG(mode):
                    out[rel] = full.read_bytes()
        return out

    def close(self) -> None:
        for fd in self._fifo_fds:
            os.close(fd)
        self._fifo_fds.clear()
        for p in self._immutable:
            subprocess.run(["chattr", "-i", str(p)], check=False, timeout=30)
        self._immutable.clear()
        for p in self._readonly:
            p.chmod(0o644)
        self._readonly.clear()


def build_tree(root: Path, board: str | dict[str, Any], *,
               overrides: dict[str, str] | None = None,
               read_errors: list[str] | None = None) -> FakeBoard:
    """Build the snapshot's files, ``_symlinks`` and ``_read_errors`` below ``root``.

    ``overrides`` replaces/adds file texts (exact); ``read_errors`` adds unreadable files.
    """
    snapshot = load_snapshot(board) if isinstance(board, str) else board
    root.mkdir(parents=True, exist_ok=True)
    fake = FakeBoard(root, snapshot)
    files = {k: v for k, v in snapshot.items() if k.startswith("/")}
    files.update(overrides or {})
    for abspath, text in sorted(files.items()):
        fake.write(abspath, text)
    for link, target in sorted(snapshot.get("_symlinks", {}).items()):
        lp = fake.path(link)
        lp.parent.mkdir(parents=True, exist_ok=True)
        # absolute targets point into the fake root, relative ones stay relative
        os.symlink(str(fake.path(target)) if target.startswith("/") else target, lp)
    for abspath in list(snapshot.get("_read_errors", {})) + list(read_errors or []):
        fake.make_read_error(abspath)
    return fake


def three_policy_board() -> dict[str, Any]:
    """A board nobody wrote code for: cpufreq only (3 policies, 2+2+2 CPUs), no devfreq, no DT."""
    snap: dict[str, Any] = {"_symlinks": {}}
    tables = {0: [400000, 800000, 1200000, 1600000],
              2: [600000, 1200000, 1800000, 2400000],
              4: [800000, 1600000, 2400000, 3000000]}
    cpu = "/sys/devices/system/cpu"
    for first, table in tables.items():
        pol = f"{cpu}/cpufreq/policy{first}"
        cpus = f"{first} {first + 1}\n"
        snap.update({
            f"{pol}/related_cpus": cpus, f"{pol}/affected_cpus": cpus,
            f"{pol}/scaling_available_frequencies": " ".join(map(str, table)) + " \n",
            f"{pol}/scaling_available_governors":
                "conservative ondemand userspace powersave performance schedutil \n",
            f"{pol}/scaling_governor": "schedutil\n",
            f"{pol}/scaling_setspeed": "<unsupported>\n",
            f"{pol}/scaling_min_freq": f"{table[0]}\n",
            f"{pol}/scaling_max_freq": f"{table[-1]}\n",
            f"{pol}/scaling_cur_freq": f"{table[1]}\n",
            f"{pol}/cpuinfo_min_freq": f"{table[0]}\n",
            f"{pol}/cpuinfo_max_freq": f"{table[-1]}\n",
        })
        for c in (first, first + 1):
            snap[f"{cpu}/cpu{c}/online"] = "1\n"
            snap["_symlinks"][f"{cpu}/cpu{c}/cpufreq"] = f"../cpufreq/policy{first}"
    snap[f"{cpu}/online"] = "0-5\n"
    return snap


@pytest.fixture(params=ALL_BOARDS)
def any_board(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FakeBoard]:
    """Each snapshot board in turn, as a fake tree."""
    fake = build_tree(tmp_path / "root", request.param)
    fake.name = request.param  # type: ignore[attr-defined]
    yield fake
    fake.close()


@pytest.fixture
def orin(tmp_path: Path) -> Iterator[FakeBoard]:
    fake = build_tree(tmp_path / "root", "orin")
    yield fake
    fake.close()


@pytest.fixture
def fake_board(tmp_path: Path) -> Iterator[Any]:
    """Factory: ``fake_board("sm8650", overrides=...)``; every tree is closed at teardown."""
    made: list[FakeBoard] = []

    def make(board: str | dict[str, Any], **kw: Any) -> FakeBoard:
        fake = build_tree(tmp_path / f"root{len(made)}", board, **kw)
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.close()
