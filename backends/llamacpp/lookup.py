"""Prompt lookup decoding (``[backends.llamacpp] speculative = "prompt_lookup"``): a draft
source that copies tokens from the request's own prompt and output; verified by
:mod:`.speculative` like every draft source.

After each sampled token, :class:`PromptLookup` finds the last 3 tokens where they occurred
earlier in prompt + output (their *most recent* earlier occurrence: the one a rewrite is
copying now), and drafts the up to ``k`` tokens that followed it. Free-form chat rarely
continues an earlier n-gram the way it went before, and each rejected draft costs a batched
decode: the verifier's acceptance and cost rules stop drafting for such a request.
"""

from __future__ import annotations

import numpy as np

from edgepilot.backends.llamacpp.speculative import EMPTY, Drafter

MAX_NGRAM = 3  # the longest suffix looked up; then shorter ones
MIN_NGRAM = 3  # shorter repeats (a chat template's bigram) are weak evidence of a copy
K_START = 1  # tokens drafted at first: a batch of 2 costs ~1.8 single decodes here


def find_draft(ids: np.ndarray, k: int, max_ngram: int = MAX_NGRAM,
               min_ngram: int = MIN_NGRAM) -> np.ndarray:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest
    suffix of ``ids`` (``max_ngram`` tokens down to 1); empty when none occurred."""
    n_ids = len(ids)
    for n in range(min(max_ngram, n_ids - 1), min_ngram - 1, -1):
        pattern = ids[n_ids - n:]
        # windows starting at 0 .. n_ids - n - 1: each has at least one token after it
        windows = np.lib.stride_tricks.sliding_window_view(ids[:n_ids - 1], n)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return np.asarray(ids[start:start + k], dtype=np.intc)
    return EMPTY


class PromptLookup(Drafter):
    """One request's prompt-lookup drafter (:func:`find_draft` behind the shared verifier)."""

    k_start = K_START
    kind = "prompt_lookup"

    def propose(self, ids: np.ndarray, k: int) -> np.ndarray:
        return find_draft(ids, k)
