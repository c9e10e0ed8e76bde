"""Native runtimes that print straight to file descriptor 2, filtered.

Some runtimes write informational lines to stderr from C++, past Python's logging and with no
switch to turn them off (LiteRT prints ``INFO: Created TensorFlow Lite XNNPACK delegate for
CPU.`` once per process, whatever ``TF_CPP_MIN_LOG_LEVEL`` says). :func:`stderr_without`
sends fd 2 to a temporary file around such a call and writes back everything but the messages
named, so nothing else printed meanwhile (another thread's log line) is lost, only delayed.
The messages are cut out, not the lines holding them: LiteRT writes its severity, its message
and its newline in three writes, and another thread's line written between them shares the
native message's line (a daemon's "measuring the kernel corpus" line was lost that way).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence

log = logging.getLogger(__name__)
_lock = threading.Lock()
# where a dropped message was, and the severity the runtime wrote just before it (if nothing
# came between them): both go, whatever another thread wrote around them stays
_CUT = b"\x00edgepilot-cut\x00"
_SEVERITY = re.compile(rb"(?:(?:INFO|WARNING|ERROR): )?" + re.escape(_CUT))


@contextlib.contextmanager
def stderr_without(drop: Sequence[bytes]) -> Iterator[list[bytes]]:
    """Run the body with fd 2 captured; lines containing any of ``drop`` are dropped (and
    listed in the yielded list once the body is done), the rest written back to fd 2."""
    dropped: list[bytes] = []
    with _lock:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no usable stderr: nothing to filter
            yield dropped
            return
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield dropped
            finally:
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                data = tmp.read()
                for d in drop:
                    dropped += [d] * data.count(d)
                    data = _SEVERITY.sub(b"", data.replace(d, _CUT))
                keep = [ln for ln in data.splitlines(keepends=True) if ln.strip()]
                if keep:
                    with contextlib.suppress(OSError):
                        os.write(2, b"".join(keep))
    for line in dropped:
        log.debug("native: %s", line.decode(errors="replace").rstrip())


# ggml_log_level of the llama.cpp this llama-cpp-python wraps: NONE, DEBUG, INFO, WARN, ERROR,
# CONT (a continuation of the previous line). llama-cpp-python 0.3's own callback reads this
# enum as the older INFO=1..ERROR=3 one, so with ``verbose=False`` it prints every warning raw
# to stderr; this one sends whole lines to the ``llama.cpp`` logger at their own level.
# ggml DEBUG lines (graph internals, hundreds per load) sit below logging.DEBUG: never shown
_GGML_LEVELS = {1: 5, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
llama_log = logging.getLogger("llama.cpp")
_llama_callback: object = None  # kept referenced: llama.cpp calls it for the process lifetime
_llama_line = threading.local()


def route_llama_logs(llama_cpp: object) -> None:
    """Send llama.cpp's native log to Python logging (once per process; idempotent)."""
    global _llama_callback
    if _llama_callback is not None:
        return
    cb_type = getattr(llama_cpp, "llama_log_callback", None)
    set_cb = getattr(llama_cpp, "llama_log_set", None)
    if cb_type is None or set_cb is None:
        return

    def on_log(level: int, text: bytes, _user: object) -> None:
        state = _llama_line
        if level != 5:  # a new message; 5 continues the previous one at its level
            _flush(state)
            state.level = _GGML_LEVELS.get(level, logging.DEBUG)
        lvl = getattr(state, "level", logging.DEBUG)
        if not llama_log.isEnabledFor(lvl):
            return
        buf = state.__dict__.setdefault("buf", [])
        buf.append(text.decode("utf-8", errors="replace") if text else "")
        if buf[-1].endswith("\n"):
            _flush(state)

    import ctypes

    _llama_callback = cb_type(on_log)
    set_cb(_llama_callback, ctypes.c_void_p(0))


def _flush(state: threading.local) -> None:
    buf = state.__dict__.get("buf")
    if buf:
        line = "".join(buf).rstrip()
        buf.clear()
        if line:
            llama_log.log(state.level, "%s", line)
