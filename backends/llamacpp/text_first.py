"""A plain-text answer to a chat with tools: its first token may not open a call.

Under ``tool_choice`` ``"auto"`` an answer is a call or text, told apart by its first
character (``serving/tools.py``). Generated whole under the grammar of both, a plain-text
answer paid for the grammar on every token (llama.cpp checks each candidate against it: 11x
slower here) and could not stream. So the daemon first asks for one token under that grammar,
and where it is text, generates the answer with no grammar, its first token kept from opening
a call as the grammar's text branch did: no JSON object, list or string, no leading space
(``text_first`` in the parameters). The mask over the vocabulary is made once per model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgepilot.backends.llamacpp.runtime import import_llama_cpp

# what the grammar's text branch may not start with (serving/tools.py: [^{[" \t\n])
_OPENERS = ("{", "[", '"', " ", "\t", "\n", "\r")


def _mask(llm: Any) -> np.ndarray:
    """True for each token that may not open a plain-text answer (cached per model)."""
    mask = getattr(llm, "edgepilot_text_first", None)
    if mask is None:
        n = int(llm.n_vocab())
        mask = np.zeros(n, dtype=bool)
        for token in range(n):
            text = bytes(llm.detokenize([token])).decode("utf-8", errors="ignore")
            mask[token] = not text or text.startswith(_OPENERS)
        llm.edgepilot_text_first = mask
    return mask


def with_text_first(params: dict[str, Any], llm: Any) -> dict[str, Any]:
    """``params`` without ``text_first``, with a processor banning call openers at the first
    generated token when it was set."""
    if not params.pop("text_first", False):
        return params
    mask = _mask(llm)
    seen: list[int] = []

    def text_first(input_ids: Any, scores: Any) -> Any:
        if not seen:  # the first token generated; the prompt was its input
            seen.append(len(input_ids))
            scores[mask[: len(scores)]] = -np.inf
        return scores

    llama_cpp = import_llama_cpp()
    processors = llama_cpp.LogitsProcessorList([text_first,
                                                *(params.get("logits_processor") or [])])
    return {**params, "logits_processor": processors}
