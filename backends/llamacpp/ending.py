"""How the daemon ends a generation llama-cpp-python would not end: a cancel (a client gone, a
shutdown past its drain), bytes that stopped being UTF-8, ``max_tokens`` reached inside a
character. One logits processor watches all three (:func:`cancellable`); it forces
end-of-sequence where no grammar forbids it, else asks for a stop that
:func:`~edgepilot.backends.llamacpp.runtime.with_stop_requests` turns into a stopping criterion.
"""

from __future__ import annotations

import codecs
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from edgepilot.backends.llamacpp.runtime import import_llama_cpp


def cancellable(params: dict[str, Any], cancel: threading.Event | None, eos: int,
                detokenize: Callable[[list[int]], bytes] | None = None) -> dict[str, Any]:
    """``params`` with a logits processor that ends the generation at the next token once
    ``cancel`` is set (a client gone, a shutdown past its drain deadline): only end-of-sequence
    stays possible. Without it a generation that yields nothing for a while (held-back partial
    UTF-8, a non-streamed request) runs to ``max_tokens`` and keeps the process from exiting.
    (Raising instead does not work: llama-cpp-python calls processors from a C callback that
    prints exceptions and carries on.)

    With ``detokenize`` (token ids -> bytes) it also ends a generation HOLD_LIMIT tokens after
    its bytes stopped being UTF-8: llama-cpp-python's stream holds every token back from the
    first invalid byte on and tries each prefix of the held-back tokens again at every token,
    so a model that emits one (a random-weight GGUF often does) runs to ``max_tokens``
    yielding nothing, slower at every token: a request with no limit ran 20 minutes and held
    its device all along. What was held back is still returned (llama-cpp-python drops the
    invalid bytes at the end).

    And it holds ``max_tokens``: llama-cpp-python checks the limit only after a token that
    completes a character, so an answer ending inside one (an emoji's bytes) ran past it
    (``max_tokens`` 4 gave 6 tokens); the generation stops before sampling past it."""
    limit = params.get("max_tokens")
    limit = limit if isinstance(limit, int) and limit > 0 else None
    if cancel is None and detokenize is None and limit is None:
        return params
    # Under a grammar (structured output, tool calls) end-of-sequence is only allowed where the
    # grammar ends: forced anywhere else, llama.cpp's grammar is left with no state and aborts
    # the process. Such a generation is ended by a stopping criterion instead, which runs
    # after sampling and touches no logits (:func:`with_stop_requests`); its finish_reason is
    # llama-cpp-python's "length", the text cut where it stood.
    constrained = params.get("grammar") is not None
    prompt: list[int] = []  # the context's length at the first call: the prompt
    broken: list[int] = []  # where the bytes stopped being UTF-8
    # the index among the generated tokens of the first one not to take (a stopping
    # criterion ends the generation there): the parallel engine samples ahead of its reader
    stop: list[int] = []

    def check(input_ids: Any, scores: Any) -> Any:
        n = len(input_ids)
        if not prompt:
            prompt.append(n)
        if limit is not None and n - prompt[0] >= limit:
            stop.append(n - prompt[0])  # one past the limit: never taken
            return scores
        if broken and n <= broken[0]:  # a draft that held it was rejected
            broken.clear()
        if detokenize is not None and not broken and not_utf8(detokenize, input_ids, prompt[0]):
            broken.append(n)
        if (cancel is not None and cancel.is_set()) or (broken and n - broken[0] >= HOLD_LIMIT):
            if constrained:
                stop.append(n - prompt[0])
            else:
                scores[:] = -np.inf
                scores[eos] = 0.0
        return scores

    check.stop_requested = lambda: min(stop, default=None)  # type: ignore[attr-defined]

    # reads only the last few tokens: a rejected draft among them is forgotten once the
    # context is back before it
    check.draft_safe = True  # type: ignore[attr-defined]

    llama_cpp = import_llama_cpp()
    processors = llama_cpp.LogitsProcessorList([*(params.get("logits_processor") or []), check])
    return {**params, "logits_processor": processors}


UTF8_WINDOW = 8  # tokens: a character is at most 4 bytes, each a token at worst
# tokens held back (llama-cpp-python's retries: ~0.1 s in all) before such a generation ends
HOLD_LIMIT = 64


def not_utf8(detokenize: Callable[[list[int]], bytes], input_ids: Any, start: int) -> bool:
    """Whether the last tokens generated (after ``start``) hold a byte sequence that no
    further byte can make UTF-8 (a character cut at the window's start is no error, nor one
    the next tokens may complete)."""
    tail = [int(t) for t in input_ids[max(start, len(input_ids) - UTF8_WINDOW):]]
    if not tail:
        return False
    data = detokenize(tail)
    data = data[next((i for i, b in enumerate(data[:4]) if b & 0xC0 != 0x80), 0):]
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        return True
    return False
