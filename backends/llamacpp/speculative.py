"""Speculative decoding on the one-sequence GGUF path: the verifier every draft source shares.

A **draft source** proposes the next tokens; two exist: :class:`.lookup.PromptLookup` copies
them from the request's own tokens (``speculative = "prompt_lookup"``), and
:class:`.draft_model.DraftModel` has a second, smaller GGUF of the same vocabulary propose them
greedily in a llama context of its own (``speculative = "draft"``). Both are a
:class:`Drafter`: llama-cpp-python's ``generate`` calls it with every token so far after each
sampled one and decodes [last token, drafts] in one ``llama_decode`` (:func:`decode_drafts`,
logits for the batch's positions only: llama-cpp-python's own ``draft_model`` support turns on
``logits_all`` for every decode, the prompt's included, and fails past 512 tokens without it),
samples at every position in turn, keeps the drafts as long as each sampled token equals the
next draft, and removes the rest from the KV cache (``kv_cache_seq_rm``): every token emitted
is the sampler's own choice given the tokens before it, and with flash attention (required) a
token's logits in a batch equal its logits decoded alone, so the output is the plain path's
(bench/README.md: without flash attention they differ, and answers changed).

``k`` adapts: from the source's ``k_start``, doubled (up to :data:`K_MAX`) when a whole draft
was taken, cut to one more than what was taken otherwise. After :data:`OFF_AFTER` rounds, a
request with under :data:`OFF_RATE` of its drafted tokens taken, or after :data:`COST_AFTER`,
one whose drafting (the source's own time plus the draft batches) took longer per token it
produced than the model's single-token decode, stops drafting for the rest of the request.
Only greedy requests (temperature 0, no grammar, no logits processor that reads the tokens:
those would see drafts not yet verified) draft at all.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

K_MIN = 1
K_MAX = 16
K_GROW = 2  # k is multiplied by this after a round whose drafts were all taken
OFF_AFTER = 2  # rounds of drafts before the request's acceptance rate is judged
COST_AFTER = 4  # rounds before its cost is (k has grown by then: small batches cost the most)
OFF_RATE = 0.6  # below this share of drafted tokens taken: drafting stops for the request
# (measured: a free-form story at 53% ran 0.95x with 2 threads, where a copy takes 85%)
EMA = 0.2  # weight of a new single-token decode time in the model's running figure

EMPTY = np.zeros(0, dtype=np.intc)


class Drafter(ABC):
    """One request's draft source, in llama-cpp-python's ``LlamaDraftModel`` shape (called
    with every token so far after each sampled one, returns the drafts), and its counts.

    A source implements :meth:`propose`; ``k_start`` is its first draft length. ``single_s``:
    the model's running time of a single-token decode (None: none timed yet). Drafting also
    stops when the drafts cost more per token they produced than that: a batch of k + 1
    tokens costs nearly k + 1 single decodes for small k on a CPU (measured: bench/README.md),
    so a modest acceptance rate can still be a loss."""

    k_start = 1
    kind = ""  # the ``speculative`` setting this source serves

    def __init__(self, single_s: float | None = None) -> None:
        self.k = self.k_start
        self.single_s = single_s
        self.drafted = 0  # tokens drafted in this request
        self.accepted = 0  # of them, taken (the sampler chose the same token)
        self.rounds = 0  # batches of drafts decoded
        self.off = ""  # why drafting stopped for the rest of the request ("": it did not)
        self.pending = 0  # drafts of the batch to decode next (decode_drafts consumes it)
        self.batch_s = 0.0  # time drafting: proposing, and the draft batches
        self.after_batch = False  # the last decode was a draft batch
        self.produced = 0  # tokens they produced: one per round plus the drafts taken
        self._last = 0  # drafts of the round under verification
        self._taken = 0  # of them, taken so far
        self._checked = 0  # of them, verified so far (taken or not)

    @abstractmethod
    def propose(self, ids: np.ndarray, k: int) -> np.ndarray:
        """Up to ``k`` tokens to follow ``ids`` (every token so far), as ``intc``."""

    def __call__(self, input_ids: np.ndarray, /, **kwargs: Any) -> np.ndarray:
        self._settle()
        if self.off:
            return EMPTY
        start = time.perf_counter()
        drafts = self.propose(np.asarray(input_ids), self.k)
        self.batch_s += time.perf_counter() - start
        self._last = self.pending = len(drafts)
        self._taken = self._checked = 0
        self.drafted += len(drafts)
        self.rounds += 1 if len(drafts) else 0
        return drafts

    def checked(self, taken: bool) -> None:
        """The sampler's choice at one drafted position equalled the draft (``taken``) or not."""
        self._checked += 1
        if taken:
            self._taken += 1
            self.accepted += 1

    def finish(self) -> None:
        """The generation ended. Drafts of its last round that were never verified (it stopped
        at max_tokens or a stop string inside the round, all drafts before taken) are no
        drafts: neither taken nor rejected."""
        if self._last and self._checked == self._taken:
            self.drafted -= self._last - self._checked
        self._last = 0

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
    """``Llama.eval`` of a drafting generation, where it differs from the plain one: a
    [last token, drafts] batch is decoded by :func:`decode_drafts` and timed, a single token
    is timed into the model's running figure (``llm.single_decode_s``). True: ``tokens``
    were decoded here; False: the caller decodes them (a prompt)."""
    drafter = llm.draft_model
    if not isinstance(drafter, Drafter):
        return False
    if drafter.pending and len(tokens) > 1:
        # fewer drafts than made when the context ran out of room
        drafter.drafted -= drafter.pending - (len(tokens) - 1)
        drafter.pending = 0
        start = time.perf_counter()
        decode_drafts(llm, tokens)
        drafter.batch_s += time.perf_counter() - start
        drafter.after_batch = True
        return True
    if len(tokens) == 1:
        start = time.perf_counter()
        llm.eval_plain(tokens)
        took = time.perf_counter() - start
        if drafter.after_batch:
            # llama.cpp rebuilds its graph for the first single decode after a batch: that
            # extra belongs to the batch, not to the single-token figure it is compared with
            drafter.after_batch = False
            prev = llm.single_decode_s
            drafter.batch_s += max(0.0, took - prev) if prev is not None else 0.0
            return True
        prev = llm.single_decode_s
        llm.single_decode_s = took if prev is None else (1 - EMA) * prev + EMA * took
        drafter.single_s = llm.single_decode_s
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


def draft_usage(drafter: Drafter | None) -> dict[str, int] | None:
    """OpenAI's ``usage.completion_tokens_details`` (its Predicted Outputs names) for a request
    that drafted; None for one that did not."""
    if drafter is None:
        return None
    return {"accepted_prediction_tokens": drafter.accepted,
            "rejected_prediction_tokens": drafter.rejected}
