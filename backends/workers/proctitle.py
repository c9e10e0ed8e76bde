"""A worker's command line, rewritten in place so that ``ps`` shows what it serves now.

A spare llama.cpp worker is started before anyone knows which model it will serve (see
:mod:`..llamacpp.spare`), yet operators read a worker's model off its command line
(``edgepilot worker llamacpp <model> --fd N``). Linux shows ``/proc/<pid>/cmdline`` from the
process's own memory (the argument strings the kernel copied onto its stack, between the
``arg_start`` and ``arg_end`` of ``/proc/<pid>/stat``), so a process may rewrite it there, as
setproctitle(3) does; this is that, for the one case we need: new arguments no longer than the
room the original ones took (a spare is started with a placeholder wide enough for any model
name), the rest filled with NULs. Nothing is written unless that memory holds exactly the
arguments the interpreter was started with.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

# /proc/<pid>/stat fields arg_start and arg_end (48 and 49, since Linux 3.5), counted after
# the command name's closing parenthesis (field 3 is the first there)
ARG_START_FIELD = 48 - 3
ARG_END_FIELD = 49 - 3
# what this module last wrote there (the memory must hold it, or the original, to be rewritten)
_written: bytes | None = None


def _arg_area() -> tuple[int, int] | None:
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[ARG_START_FIELD]), int(fields[ARG_END_FIELD])
    except (OSError, IndexError, ValueError):
        return None
    return (start, end) if 0 < start < end else None


def set_cmdline(args: list[str]) -> bool:
    """Show ``args`` as this process's command line (``ps``, ``/proc/<pid>/cmdline``); cut at
    the room the original command line took. False (nothing written) where that cannot be
    done safely: not Linux, or the argument memory is not what the process started with."""
    area = _arg_area()
    if area is None:
        return False
    start, end = area
    room = end - start
    global _written
    expected = _written or b"\0".join(os.fsencode(a) for a in sys.orig_argv) + b"\0"
    if len(expected) != room or ctypes.string_at(start, room) != expected:
        return False  # someone else moved or rewrote it: leave it alone
    # NUL-padded with the last byte NUL: the kernel shows exactly [arg_start, arg_end)
    new = b"\0".join(os.fsencode(a) for a in args)[:room - 1].ljust(room, b"\0")
    ctypes.memmove(start, new, room)
    _written = new
    return True


def replace_arg(old: str, new: str) -> bool:
    """:func:`set_cmdline` with the original argument ``old`` shown as ``new``."""
    args = list(sys.orig_argv)
    if old not in args:
        return False
    args[args.index(old)] = new
    return set_cmdline(args)
