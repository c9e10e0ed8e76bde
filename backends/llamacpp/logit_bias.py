"""OpenAI's ``logit_bias`` as a logits processor of ours.

llama-cpp-python takes ``logit_bias`` itself, but given a processor list too it replaces the
list with ``list.extend``'s ``None`` (llama_cpp/llama.py, ``create_completion``), dropping the
daemon's processors: the cancel check that ends a generation whose client left, and the
logprob recorder. So the bias is applied here, first in the list, and llama-cpp-python never
sees the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgepilot.backends.llamacpp.runtime import import_llama_cpp
from edgepilot.errors import CommandError

BIAS_RANGE = 100.0  # OpenAI's: -100 bans a token, +100 makes it the only choice


def token_biases(bias: Mapping[Any, Any], n_vocab: int) -> dict[int, float]:
    """``bias`` (token id, as OpenAI sends it a string, -> bias) checked against this model's
    vocabulary; a bad entry is a :class:`CommandError` naming it and the range."""
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise CommandError(f"logit_bias key {key!r} is not a token id (an integer, as a "
                               "string)", field="logit_bias") from None
        if not 0 <= token < n_vocab:
            raise CommandError(f"logit_bias token id {token} is not in this model's "
                               f"vocabulary [0, {n_vocab}); ids are this model's tokenizer's",
                               field="logit_bias")
        if not -BIAS_RANGE <= float(value) <= BIAS_RANGE:
            raise CommandError(f"logit_bias of token {token} is {value}; allowed: "
                               f"-{BIAS_RANGE:g} to {BIAS_RANGE:g}", field="logit_bias")
        out[token] = float(value)
    return out


def with_logit_bias(params: dict[str, Any], n_vocab: int) -> dict[str, Any]:
    """``params`` without ``logit_bias``, with a processor adding it first among its logits
    processors (none when the bias is absent or empty)."""
    bias = params.pop("logit_bias", None)
    if not bias:
        return params
    biases = token_biases(bias, n_vocab)
    ids = np.fromiter(biases, dtype=np.intp, count=len(biases))
    add = np.fromiter(biases.values(), dtype=np.float32, count=len(biases))

    def biased(input_ids: Any, scores: Any) -> Any:
        scores[ids] += add
        return scores

    biased.draft_safe = True  # type: ignore[attr-defined]  # reads no tokens: drafting may go on
    llama_cpp = import_llama_cpp()
    processors = llama_cpp.LogitsProcessorList([biased, *(params.get("logits_processor") or [])])
    return {**params, "logits_processor": processors}
