"""Prompt lookup decoding on the one-sequence GGUF path (``[backends.llamacpp] speculative =
"prompt_lookup"``): draft tokens copied from the request's own tokens, verified in one batch.

After each sampled token, :class:`PromptLookup` finds the last 3 tokens where they occurred
earlier in prompt + output (their *most recent* earlier occurrence: the one a rewrite is
copying now), and drafts the up to ``k`` tokens that followed it. llama-cpp-python's
``generate`` then decodes [last token, drafts] in one ``llama_decode``, samples at every
position in turn, keeps the drafts as long as each sampled token equals the next draft, and
removes the rest from the KV cache (``kv_cache_seq_rm``): every token emitted is the sampler's
own choice given the tokens before it, and with flash attention (required) a token's logits in
a batch equal its logits decoded alone, so the output is the plain path's (bench/README.md:
without flash attention they differ, and answers changed). :func:`decode_drafts` asks logits
for the batch's positions only: llama-cpp-python's own ``draft_model`` support turns on
``logits_all`` for every decode, the prompt's included.

``k`` adapts: from :data:`K_START`, doubled (up to :data:`K_MAX`) when a whole draft was taken,
cut to one more than what was taken otherwise. Free-form chat rarely continues an earlier
n-gram the way it went before, and each rejected draft costs a batched decode: after
:data:`OFF_AFTER` rounds, a request with under :data:`OFF_RATE` of its drafted tokens taken, or
after :data:`COST_AFTER`, one whose draft batches took longer per token they produced than the
model's single-token decode, stops drafting for the rest of the request. Only greedy requests
(temperature 0, no grammar, no logits processor that reads the tokens: those would see drafts
not yet verified) draft at all.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

MAX_NGRAM = 3  # the longest suffix looked up; then shorter ones
MIN_NGRAM = 3  # shorter repeats (a chat template's bigram) are weak evidence of a copy
K_START = 1  # tokens drafted at first: a batch of 2 costs ~1.8 single decodes here
K_MIN = 1
K_MAX = 16
K_GROW = 2  # k is multiplied by this after a round whose drafts were all taken
OFF_AFTER = 2  # rounds of drafts before the request's acceptance rate is judged
COST_AFTER = 4  # rounds before its cost is (k has grown by then: small batches cost the most)
OFF_RATE = 0.6  # below this share of drafted tokens taken: drafting stops for the request
# (measured: a free-form story at 53% ran 0.95x with 2 threads, where a copy takes 85%)
EMA = 0.2  # weight of a new single-token decode time in the model's running figure

_EMPTY = np.zeros(0, dtype=np.intc)


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
    return _EMPTY


class PromptLookup:
    """One request's drafter, in llama-cpp-python's ``LlamaDraftModel`` shape (called with
    every token so far after each sampled one, returns the drafts), and its counts.

    ``single_s``: the model's running time of a single-token decode (None: none timed yet).
    Drafting also stops when the draft batches cost more per token they produced than that:
    a batch of k + 1 tokens costs nearly k + 1 single decodes for small k on a CPU (measured:
    bench/README.md), so a modest acceptance rate can still be a loss."""

    def __init__(self, single_s: float | None = None) -> None:
        self.k = K_START
        self.single_s = single_s
        self.drafted = 0  # tokens drafted in this request
        self.accepted = 0  # of them, taken (the sampler chose the same token)
        self.rounds = 0  # batches of drafts decoded
        self.off = ""  # why drafting stopped for the rest of the request ("": it did not)
        self.pending = 0  # drafts of the batch to decode next (decode_drafts consumes it)
        self.batch_s = 0.0  # time in the draft batches
        self.after_batch = False  # the last decode was a draft batch
        self.produced = 0  # tokens they produced: one per round plus the drafts taken
        self._last = 0  # drafts of the round under verification
        self._taken = 0  # of them, taken so far

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        self._settle()
        if self.off:
            return _EMPTY
        drafts = find_draft(np.asarray(input_ids), self.k)
        self._last = self.pending = len(drafts)
        self._taken = 0
        self.drafted += len(drafts)
        self.rounds += 1 if len(drafts) else 0
        return drafts

    def checked(self, taken: bool) -> None:
        """The sampler's choice at one drafted position equalled the draft (``taken``) or not."""
        if taken:
            self._taken += 1
            self.accepted += 1

    def _settle(self) -> None:
        # the last round is verified: adapt k, judge the request's drafting so far
        if not self._last:
            return
        self.produced += 1 + self._taken
        if self._taken >= self._last:
            self.k = min(self.k * K_GROW, K_MAX)
        else:
            self.k = max(K_MIN, self._taken + 1)
        self._last = 0
        if self.rounds < OFF_AFTER:
            return
        if self.accepted < OFF_RATE * self.drafted:
            self.off = "acceptance"
        elif self.rounds >= COST_AFTER and self.single_s is not None and \
                self.batch_s > self.single_s * self.produced:
            self.off = "cost"

    @property
    def rejected(self) -> int:
        return self.drafted - self.accepted


def eval_step(llm: Any, tokens: list[int]) -> bool:
    """``Llama.eval`` of a prompt-lookup generation, where it differs from the plain one: a
    [last token, drafts] batch is decoded by :func:`decode_drafts` and timed, a single token
    is timed into the model's running figure (``llm.single_decode_s``). True: ``tokens``
    were decoded here; False: the caller decodes them (a prompt)."""
    lookup = llm.draft_model
    if not isinstance(lookup, PromptLookup):
        return False
    if lookup.pending and len(tokens) > 1:
        # fewer drafts than made when the context ran out of room
        lookup.drafted -= lookup.pending - (len(tokens) - 1)
        lookup.pending = 0
        start = time.perf_counter()
        decode_drafts(llm, tokens)
        lookup.batch_s += time.perf_counter() - start
        lookup.after_batch = True
        return True
    if len(tokens) == 1:
        start = time.perf_counter()
        llm.eval_plain(tokens)
        took = time.perf_counter() - start
        if lookup.after_batch:
            # llama.cpp rebuilds its graph for the first single decode after a batch: that
            # extra belongs to the batch, not to the single-token figure it is compared with
            lookup.after_batch = False
            prev = llm.single_decode_s
            lookup.batch_s += max(0.0, took - prev) if prev is not None else 0.0
            return True
        prev = llm.single_decode_s
        llm.single_decode_s = took if prev is None else (1 - EMA) * prev + EMA * took
        lookup.single_s = llm.single_decode_s
        return True
    return False


def decode_drafts(llm: Any, tokens: Sequence[int]) -> None:
    """llama-cpp-python's ``Llama.eval`` of one [last token, drafts] batch, with logits for
    each of its positions (the sampler reads them by negative index) instead of the last only;
    the prompt's decodes keep asking for one row."""
    n_past = int(llm.n_tokens)
    llm._ctx.kv_cache_seq_rm(-1, n_past, -1)
    llm._batch.set_batch(batch=list(tokens), n_past=n_past, logits_all=True)
    llm._ctx.decode(llm._batch)
    llm.input_ids[n_past:n_past + len(tokens)] = tokens
    llm.n_tokens = n_past + len(tokens)
    llm._requires_eval = False


def may_draft(kwargs: dict[str, Any]) -> bool:
    """Whether a generation with ``generate``'s keyword arguments may draft: greedy, no grammar,
    and every logits processor marked ``draft_safe`` (it reads no tokens: a processor is called
    with the tokens in the context, drafts not yet verified among them)."""
    if float(kwargs.get("temp", 0.8)) != 0.0 or kwargs.get("grammar") is not None:
        return False
    if int(kwargs.get("mirostat_mode", 0)):
        return False
    return all(getattr(p, "draft_safe", False) for p in kwargs.get("logits_processor") or [])


def lookup_usage(lookup: PromptLookup | None) -> dict[str, int] | None:
    """OpenAI's ``usage.completion_tokens_details`` (its Predicted Outputs names) for a request
    that drafted by prompt lookup; None for one that did not."""
    if lookup is None:
        return None
    return {"accepted_prediction_tokens": lookup.accepted,
            "rejected_prediction_tokens": lookup.rejected}
