"""Grammars that made llama.cpp abort a model's worker: refused from then on, not resent.

llama.cpp aborts the process on some grammar and sampler failures (an empty grammar stack
after a token, its asserts). In a worker process that costs the requests in flight a 503 and
the worker a restart; a client that resends the same request (the ``openai`` client retries a
503 twice by itself) would crash it again, each time. So a constrained generation whose worker
died of SIGABRT (or SIGSEGV, SIGBUS...) leaves its grammar here, and the next request with the
same grammar on that model is a 400 naming the field it came from (``format``,
``response_format``, ``tools``) and saying why, until the model is reloaded. Other grammars,
and requests without one, go on.
"""

from __future__ import annotations

import hashlib
import signal
import time
from collections import OrderedDict
from typing import Any

from edgepilot.backends.llamacpp.grammar import field_of, text_of
from edgepilot.errors import GrammarAborted

MAX_KEPT = 64  # grammars remembered per model, the oldest forgotten first
# deaths native code dies of: an abort, and a grammar llama.cpp failed to parse and sampled
# with anyway (SIGSEGV, on every retry a client made)
_NATIVE_DEATHS = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE}


def _key(params: dict[str, Any]) -> str | None:
    text = text_of(params.get("grammar"))
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


class AbortedGrammars:
    """The grammars that aborted one model's worker, and why (for the 400)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._kept: OrderedDict[str, str] = OrderedDict()

    def refuse(self, params: dict[str, Any]) -> None:
        """GrammarAborted (400) naming the grammar's field when it aborted a worker before."""
        key = _key(params)
        if key is not None and key in self._kept:
            field = field_of(params["grammar"])
            raise GrammarAborted(f"{field}: {self._kept[key]}", field=field)

    def died(self, params: dict[str, Any], returncode: int | None, pid: int | None) -> None:
        """A worker running a generation with ``params`` ended with ``returncode``: remember
        its grammar when llama.cpp aborted (SIGABRT)."""
        key = _key(params)
        if key is None or returncode is None or -returncode not in _NATIVE_DEATHS:
            return
        field = field_of(params["grammar"])
        self._kept[key] = (
            f"this {field} made llama.cpp abort the worker of model {self.model!r} "
            f"({signal.Signals(-returncode).name}, pid {pid}, at {time.strftime('%H:%M:%S')}); "
            "the worker was restarted, and the "
            f"same {field} is refused for this model from now on rather than crash it again "
            "(until the model is reloaded): change the schema or the tools")
        while len(self._kept) > MAX_KEPT:
            self._kept.popitem(last=False)
