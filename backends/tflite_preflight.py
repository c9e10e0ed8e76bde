"""Whether the TFLite interpreter survives preparing a file, asked in a child process first.

LiteRT's kernels end the process on some files that parse fine: a failed check in an
operator's ``Prepare`` (a quantized ADD whose output scale is 0 aborts in
``QuantizeMultiplierSmallerThanOneExp``) is a SIGABRT, not a Python exception. In the daemon
that takes every model down with it, and the raw runtime dies on such a file the same way. So
the first time a file is seen, a child process builds and allocates it as the raw runtime
would; a child killed by a signal makes the file unrunnable, with the signal and the
interpreter's last words. A child that exits any other way is not judged here: the in-process
build says what a Python-level error means (a dynamic model that allocates only at its first
call's shapes, a custom op), as it always has.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path

from edgepilot.errors import UnrunnableModel

log = logging.getLogger(__name__)

# the raw runtime on the file: ai_edge_litert, else tflite_runtime (as the backend picks)
_CHILD = """
import sys
try:
    from ai_edge_litert.interpreter import Interpreter
except ImportError:
    from tflite_runtime.interpreter import Interpreter
try:
    Interpreter(model_path=sys.argv[1]).allocate_tensors()
except Exception:
    pass
"""
# a child still preparing after this long is left to the in-process build (not judged)
TIMEOUT_S = 120.0

_verdicts: dict[tuple[str, int, int], str] = {}
_lock = threading.Lock()


def check(path: Path) -> None:
    """Raise :class:`UnrunnableModel` when the interpreter crashes preparing ``path`` (asked once
    per file version; a few hundred ms, the child's start)."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _lock:
        verdict = _verdicts.get(key)
    if verdict is None:
        verdict = _ask(path)
        with _lock:
            _verdicts[key] = verdict
    if verdict:
        raise UnrunnableModel(verdict, field="model")


def _ask(path: Path) -> str:
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                              text=True, errors="replace", timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("TFLite preflight of %s not judged: %s", path.name, exc)
        return ""
    if proc.returncode >= 0:
        return ""
    try:
        name = signal.Signals(-proc.returncode).name
    except ValueError:
        name = f"signal {-proc.returncode}"
    last = next((ln.strip() for ln in reversed(proc.stderr.splitlines())
                 if ln.strip() and not ln.startswith("INFO:")), "")
    return (f"{path.name}: the TFLite interpreter crashes preparing this file ({name}"
            + (f": {last[:200]}" if last else "") + "); the raw runtime does the same, so "
            "no TFLite target can run it")
