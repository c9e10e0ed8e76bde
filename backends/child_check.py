"""Asking a native runtime about a file in a child process first, where a crash costs nothing.

Native runtimes end the process on some files that parse fine: a failed check in a kernel's
``Prepare`` or in an optimizer pass is a SIGABRT (or a SIGSEGV), not a Python exception. In the
daemon that takes every model down with it. So the first time a file is shown to such a runtime,
a child process does what the daemon is about to do; a child killed by a signal means the
runtime cannot take the file, and the reason carries the signal and the runtime's last words.
A child that exits any other way is not judged here: the in-process build says what a
Python-level error means, as it always has. Verdicts are kept per file version (path, mtime,
size) and question, for the life of the process.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path

log = logging.getLogger(__name__)

# a child still working after this long is left to the in-process build (not judged)
TIMEOUT_S = 120.0

_verdicts: dict[tuple[str, int, int, tuple[str, ...]], str] = {}
_lock = threading.Lock()


def crash(code: str, path: Path, *args: str) -> str:
    """How a child running ``code`` (``sys.argv[1]`` is ``path``, then ``args``) died: "" when
    it did not die by a signal, else ``"SIGABRT: <its last stderr line>"``. Asked once per file
    version and ``args``; later calls answer from memory."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size, (code, *args))
    with _lock:
        verdict = _verdicts.get(key)
    if verdict is None:
        verdict = _ask(code, path, args)
        with _lock:
            _verdicts[key] = verdict
    return verdict


def _ask(code: str, path: Path, args: tuple[str, ...]) -> str:
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(path), *args],
                              capture_output=True, text=True, errors="replace",
                              timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("child check of %s not judged: %s", path.name, exc)
        return ""
    if proc.returncode >= 0:
        return ""
    try:
        name = signal.Signals(-proc.returncode).name
    except ValueError:
        name = f"signal {-proc.returncode}"
    last = next((ln.strip() for ln in reversed(proc.stderr.splitlines())
                 if ln.strip() and not ln.startswith("INFO:")), "")
    return name + (f": {last[:200]}" if last else "")
