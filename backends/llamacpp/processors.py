"""The daemon's logits processors on one generation, set up in the order they must run.

llama-cpp-python calls them in list order on each token's logits: ``logit_bias`` first (the
recorded logprobs are those of the biased logits), the logprob recorder, then the check that
ends a generation once cancelled or once its bytes stopped being UTF-8
(:func:`~edgepilot.backends.llamacpp.ending.cancellable`). The one-at-a-time and the parallel
executables both set them up here.
"""

from __future__ import annotations

import threading
from typing import Any

from edgepilot.backends.llamacpp.ending import cancellable
from edgepilot.backends.llamacpp.logit_bias import with_logit_bias
from edgepilot.backends.llamacpp.logprobs import LogprobRecorder, with_logprobs
from edgepilot.backends.llamacpp.text_first import with_text_first


def with_processors(params: dict[str, Any], llm: Any, cancel: threading.Event | None,
                    recorded: Any = None) -> tuple[dict[str, Any], LogprobRecorder | None]:
    """A copy of ``params`` with the daemon's processors, and the logprob recorder (None
    without ``logprobs_top``). ``recorded``: what the recorder reads the sampled tokens from
    (a parallel sequence's view), ``llm`` itself by default; ``cancel`` None: the caller
    cancels another way (the parallel engine ends a cancelled sequence itself)."""
    params, recorder = with_logprobs(dict(params), llm if recorded is None else recorded)
    params = with_logit_bias(params, int(llm.n_vocab()))
    params = with_text_first(params, llm)  # before the recorder, as the bias
    params = cancellable(params, cancel, int(llm.token_eos()),
                         lambda tokens: bytes(llm.detokenize(tokens)))
    return params, recorder


def restore_text(out: dict[str, Any], params: dict[str, Any], tokens: list[int],
                 detokenize: Any, chat: bool) -> dict[str, Any]:
    """A whole answer whose generation the daemon's check ended by a stopping criterion
    (``max_tokens`` reached inside a character, a cancel or broken UTF-8 under a grammar):
    llama-cpp-python sets the answer's text only where it ends a generation itself, so it
    came back empty; it is the text of the ``tokens`` taken (invalid bytes dropped, as
    llama-cpp-python drops them). ``out`` is changed in place and returned."""
    if not any(getattr(p, "stop_requested", lambda: None)() is not None
               for p in params.get("logits_processor") or []):
        return out
    text = bytes(detokenize(tokens)).decode("utf-8", errors="ignore")
    for choice in out.get("choices") or []:
        if chat and isinstance(choice.get("message"), dict):
            if not choice["message"].get("content"):
                choice["message"]["content"] = text
        elif not choice.get("text"):
            choice["text"] = text
    return out
