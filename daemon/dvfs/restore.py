"""What the DVFS journal records of the board, and putting it back, verified.

:func:`snapshot` reads every file a profile or a vendor tool may change, before the first write
or tool run: governors and min/max limits of cpufreq policies and devfreq devices (GPU, NPU, a
memory/EMC devfreq node), every ``cpuN/online``, and every file /etc/nvpmodel.conf says nvpmodel
writes (CPU online, CPU/GPU/EMC clock limits and caps, GPU power gating).

:func:`restore_files` puts a journal back and then reads every recorded file again: the journal,
not a tool's own status, says when the board is back. A ``nvpmodel -m`` killed half-way (with
the daemon, as systemd kills the whole unit) leaves CPUs offline while ``nvpmodel -q`` still
reports the old mode; asking the tool would skip the restore, reading the files does not.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from edgepilot.board import Board
from edgepilot.board.cpufreq import CPU_DIR
from edgepilot.board.sysfs import WRITABLE_NAMES
from edgepilot.dvfs.journal import Journal
from edgepilot.dvfs.tools import JetsonClocks, NvpModel, nvpmodel_files
from edgepilot.dvfs.write_plan import limit_order
from edgepilot.errors import BoardError, EdgepilotError

log = logging.getLogger(__name__)

_MIN = ("scaling_min_freq", "min_freq")
_MAX = ("scaling_max_freq", "max_freq")
Errors = list[str]


def recorded_files(board: Board) -> list[Path]:
    """Every file a transaction records, each once (nvpmodel.conf names cpu0/cpufreq/..., the
    board's policies policy0/...: the same file through a symlink)."""
    fs = board.fs
    # scaling_setspeed reads '<unsupported>' unless userspace governs: not a setting to restore
    found = [p for p in board.writable_files() if p.name != "scaling_setspeed"]
    found += [fs.path(f"{CPU_DIR}/cpu{n}/online") for n in board.cpus_online()]
    found += [fs.path(p) for p in nvpmodel_files(fs)]
    seen: set[str] = set()
    files: list[Path] = []
    for path in found:
        real = os.path.realpath(path)
        if real not in seen and os.path.isfile(real):
            seen.add(real)
            files.append(path)
    return files


def snapshot(board: Board) -> dict[str, str]:
    """Board path -> exact text of every recorded file that reads now (an offline policy's
    files fail with EBUSY on a real board: they are recorded once they read)."""
    snap: dict[str, str] = {}
    for path in recorded_files(board):
        text = board.read_value(path)
        if text is not None:
            snap[board.fs.rel(path)] = text
    return snap


def mismatches(board: Board, target: dict[str, str], only: set[str] | None) -> dict[str, str]:
    """Board path -> what it reads now (``None`` shown as 'unreadable') where it differs from
    ``target``."""
    wrong: dict[str, str] = {}
    for rel, text in target.items():
        if only is not None and rel not in only:
            continue
        now = board.read_value(board.fs.path(rel))
        if now != text:
            wrong[rel] = "unreadable" if now is None else repr(now.strip())
    return wrong


def put_back(board: Board, target: dict[str, str], only: set[str] | None) -> dict[str, str]:
    """Write ``target``'s texts back where they differ; returns board path -> error.

    Order: CPUs that go online first (an offline CPU's cpufreq files refuse writes), then per
    device min/max in an order the kernel accepts and governors, CPUs that go offline last.
    Files not on the board layer's write allow-list (nvpmodel's EMC caps, power gating) are
    not ours to write: the tool puts them back, :func:`mismatches` checks them. Never stops
    half-way.
    """
    errors: dict[str, str] = {}
    up: list[tuple[Path, str]] = []
    down: list[tuple[Path, str]] = []
    by_dir: dict[Path, dict[str, str]] = {}
    for rel, text in target.items():
        if only is not None and rel not in only:
            continue
        path = board.fs.path(rel)
        if path.name not in WRITABLE_NAMES or board.read_value(path) == text:
            continue
        if path.name == "online":
            (up if text.strip() == "1" else down).append((path, text))
        else:
            by_dir.setdefault(path.parent, {})[path.name] = text

    def write(path: Path, text: str) -> None:
        try:
            board.write_value(path, text)
        except BoardError as exc:
            errors[board.fs.rel(path)] = exc.message

    for path, text in up:
        write(path, text)
    for directory in reversed(list(by_dir)):
        files = by_dir[directory]
        mins = [n for n in files if n in _MIN]
        maxs = [n for n in files if n in _MAX]
        cur_min = board.fs.read_int(directory / (mins[0] if mins else _MIN[0]))
        cur_max = board.fs.read_int(directory / (maxs[0] if maxs else _MAX[0]))
        order: list[str] = []
        for which in limit_order(cur_min, cur_max, _int(files[mins[0]]) if mins else None,
                                 _int(files[maxs[0]]) if maxs else None):
            order += mins if which == "min" else maxs
        order += [n for n in files if n not in order]
        for name in order:
            write(directory / name, files[name])
    for path, text in down:
        write(path, text)
    return errors


def restore_files(board: Board, journal: Journal, only: set[str], nvpmodel: NvpModel,
                  jetson_clocks: JetsonClocks) -> Errors:
    """Put the board back to ``journal.original`` (the paths in ``only``) and verify it.

    The tools go first (their own state: the nvpmodel mode, the jetson_clocks lock), then the
    files are written back exactly and read again. Files still different after that (nvpmodel
    killed half-way through files only it writes) get one more ``nvpmodel -m`` run and one more
    pass. Returns the errors, each naming a file or a tool; empty means verified.
    """
    if journal.jetson_clocks_store and Path(journal.jetson_clocks_store).exists():
        try:
            jetson_clocks.restore(Path(journal.jetson_clocks_store))
        except EdgepilotError as exc:
            # a store file cut short by a kill: its files are in the journal too, and the
            # verification below says whether they are back
            log.warning("%s; putting its files back from the DVFS journal", exc.message)
    tool_errors: Errors = []
    before = journal.nvpmodel_before
    if before is not None:
        try:
            mode: int | None = nvpmodel.query()[0]
        except EdgepilotError as exc:
            # its status file cut short by a kill: -m does not need it, and rewrites it
            log.warning("%s; setting nvpmodel mode %s without knowing the current one",
                        exc.message, before)
            mode = None
        try:
            if mode != before:
                nvpmodel.set_mode(before)
        except EdgepilotError as exc:
            tool_errors.append(exc.message)
    write_errors = put_back(board, journal.original, only)
    wrong = mismatches(board, journal.original, only)
    if wrong and before is not None and not tool_errors:
        log.warning("after restoring nvpmodel mode %s, %d file(s) still differ from the DVFS "
                    "journal (first: %s): running nvpmodel -m %s again", before, len(wrong),
                    next(iter(wrong)), before)
        try:
            nvpmodel.set_mode(before)
        except EdgepilotError as exc:
            tool_errors.append(exc.message)
        write_errors = put_back(board, journal.original, only)
        wrong = mismatches(board, journal.original, only)
    return tool_errors + named(wrong, write_errors, journal.original)


def named(wrong: dict[str, str], write_errors: dict[str, str], target: dict[str, str]) -> Errors:
    """One message per file that did not verify: its write error when there was one (it says
    why: EPERM, EBUSY...), else what it reads against what the journal holds."""
    return [write_errors.get(rel) or f"{rel} reads {now} after the restore, the DVFS journal "
            f"holds {target[rel].strip()!r}" for rel, now in wrong.items()]


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None
