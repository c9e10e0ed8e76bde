"""What every worker process shares, for the daemon side and the child: the error a crash
becomes, how an exit reads to an operator, errors as plain data across the socket, and the
worker's command line (``python -m edgepilot worker <backend> <model> --fd N``)."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any

from edgepilot import errors
from edgepilot.errors import BackendError, EdgepilotError


class WorkerCrashed(BackendError):
    """The worker process running a model died under a request (a native crash, an OOM kill,
    an operator's kill); the model's next request gets a fresh worker."""

    code = "worker_crashed"
    http_status = 503
    retry_after_s = 1  # the restart's first backoff is half a second


def how_it_ended(returncode: int | None, runtime: str = "the runtime") -> str:
    """``returncode`` in words: the signal (with what usually sends it) or the exit status."""
    if returncode is None:
        return "closed its connection"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hints = {"SIGSEGV": f"a crash in {runtime}", "SIGABRT": f"{runtime} aborted",
                 "SIGKILL": "the kernel's OOM killer or an operator",
                 "SIGBUS": f"a crash in {runtime} (a model file changed under its mmap?)"}
        hint = hints.get(name)
        return f"was killed by signal {-returncode} ({name}{': ' + hint if hint else ''})"
    return f"exited with status {returncode}"


def error_data(exc: BaseException) -> dict[str, Any]:
    """An exception as plain data for the parent (see :func:`rebuild_error`): its class name,
    message and field; anything not raised on purpose is named by its type."""
    if isinstance(exc, EdgepilotError):
        return {"type": type(exc).__name__, "message": exc.message, "field": exc.field}
    return {"type": "BackendError", "message": f"{type(exc).__name__}: {exc}", "field": None}


def rebuild_error(data: dict[str, Any]) -> Exception:
    """An error the worker sent as plain data, as the edgepilot exception it was."""
    cls = getattr(errors, str(data.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.EdgepilotError)):
        cls = BackendError
    return cls(str(data.get("message")), field=data.get("field"))


# the model a spare worker is started for (:mod:`..llamacpp.spare`): it shows "(spare)", and
# the placeholder's width leaves room to show any model name (at most 128 characters) once it
# is handed one (:mod:`.proctitle`)
SPARE = "(spare)"
SPARE_PLACEHOLDER = SPARE + "." * (128 - len(SPARE))


def worker_argv(backend: str, model: str, fd: int) -> list[str]:
    """The worker's command line: ``... -m edgepilot worker <backend> <model> --fd N``."""
    level = logging.getLevelName(logging.getLogger("edgepilot").getEffectiveLevel()).lower()
    argv = [sys.executable, "-m", "edgepilot", "worker", backend, model, "--fd", str(fd)]
    if level in ("debug", "info", "warning", "error"):
        argv += ["--log-level", level]
    return argv
