"""Draft-model speculative decoding (``[backends.llamacpp] speculative = "draft"``): a second,
smaller GGUF of the same vocabulary (``draft_model``) proposes tokens greedily in a llama
context of its own, in the same process and on the same llama.cpp thread as the served model;
the served model verifies them through :mod:`.speculative`, as it does prompt lookup's.

The draft context mirrors the tokens of the served one: before each proposal it keeps the
longest common prefix of what it holds and the request's tokens so far, removes the rest from
its KV cache (drafts the served model rejected, another conversation's tail) and decodes what
it has not seen (the request's prompt once, then the one or two tokens each round adds), then
decodes its own greedy choices one by one. The draft file is checked against the served
model's token table before llama.cpp loads it (:func:`edgepilot.formats.gguf_vocab.
check_same_vocab`); a draft that does not fit is refused with one WARNING line naming the key
and the reason, and the model serves without drafting.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from edgepilot.backends.llamacpp.speculative import EMPTY, Drafter

K_START = 2  # a draft token costs a draft decode: start short, grow when they are taken
# A draft whose single-token decode costs more than this share of the model's cannot pay on a
# CPU: a fully taken batch of 17 costs 8.4-11.4 single decodes of the model there
# (bench/README.md), so 16 drafts must cost under 0.35-0.54 of a decode each even when all are
# taken. Such a draft is not run at all (checked before each request drafts); every
# PROBE_EVERY-th request drafts anyway, to time it again.
DRAFT_COST_MAX = 0.4
PROBE_EVERY = 32
EMA = 0.2  # weight of a new draft decode time in the running figure


class DraftContext:
    """A draft GGUF loaded beside a served model, and the tokens its KV cache holds.

    ``llama_cpp``: the module; the other arguments are ``llama_cpp.Llama``'s. Every method runs
    on the llama.cpp thread."""

    def __init__(self, llama_cpp: Any, path: Path, *, n_ctx: int, n_threads: int,
                 n_gpu_layers: int, flash_attn: bool, type_k: int, type_v: int) -> None:
        self.path = path
        self._llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
            n_gpu_layers=n_gpu_layers, flash_attn=flash_attn, type_k=type_k, type_v=type_v,
            seed=0, verbose=False)
        self.n_ctx = int(self.llm.n_ctx())
        self.n_vocab = int(self.llm.n_vocab())
        self.held: list[int] = []  # the tokens in the draft's KV cache, by position
        self.decode_s: float | None = None  # running time of one single-token draft decode
        self.requests = 0  # requests that asked it for drafts

    def set_threads(self, n_threads: int) -> None:
        self._llama_cpp.llama_set_n_threads(self.llm.ctx, n_threads, n_threads)

    def close(self) -> None:
        self.llm.close()

    def _decode(self, tokens: list[int]) -> None:
        # logits for the last token only: the next greedy choice is all a draft reads
        llm = self.llm
        for i in range(0, len(tokens), llm.n_batch):
            chunk = tokens[i:i + llm.n_batch]
            llm._batch.set_batch(batch=chunk, n_past=len(self.held), logits_all=False)
            llm._ctx.decode(llm._batch)
            self.held.extend(chunk)

    def sync(self, ids: list[int]) -> None:
        """Make the KV cache hold ``ids`` (kept prefix, the rest removed, the new decoded); the
        last token is decoded again if it was held, for its logits."""
        n = 0
        for a, b in zip(self.held, ids, strict=False):
            if a != b:
                break
            n += 1
        n = min(n, len(ids) - 1)
        if n < len(self.held):
            self.llm._ctx.kv_cache_seq_rm(-1, n, -1)
            del self.held[n:]
        self._decode(ids[n:])

    def greedy(self, k: int) -> list[int]:
        """Up to ``k`` greedy tokens after the held ones (an end-of-generation token ends them);
        all but the last are decoded into the cache."""
        llama_cpp = self._llama_cpp
        vocab = self.llm._model.vocab
        out: list[int] = []
        for i in range(k):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1),
                                           shape=(self.n_vocab,))
            token = int(np.argmax(logits))
            out.append(token)
            if i == k - 1 or llama_cpp.llama_vocab_is_eog(vocab, token):
                break
            start = time.perf_counter()
            self._decode([token])
            took = time.perf_counter() - start
            prev = self.decode_s
            self.decode_s = took if prev is None else (1 - EMA) * prev + EMA * took
        return out

    def too_dear(self, single_s: float | None) -> bool:
        """Whether a draft decode costs more than :data:`DRAFT_COST_MAX` of the model's
        single-token decode ``single_s`` (False until both were timed)."""
        if self.decode_s is None or single_s is None:
            return False
        return self.decode_s > DRAFT_COST_MAX * single_s


class DraftModel(Drafter):
    """One request's draft-model drafter: :class:`DraftContext` behind the shared verifier.

    The draft's first sync decodes the request's prompt; that is paid once whatever drafting
    does after, so it is kept apart (``prefill_s``) from the cost the switch-off rule judges.
    A draft too dear to pay (:meth:`DraftContext.too_dear`) is switched off for the request
    before it syncs ("cost"), but for every :data:`PROBE_EVERY`-th request."""

    k_start = K_START
    kind = "draft"

    def __init__(self, context: DraftContext, single_s: float | None = None) -> None:
        super().__init__(single_s)
        self.context = context
        self.prefill_s: float | None = None
        context.requests += 1
        self.probe = context.requests % PROBE_EVERY == 0

    def propose(self, ids: np.ndarray, k: int) -> np.ndarray:
        context = self.context
        tokens = [int(t) for t in ids]
        # the draft cache holds the tokens and all drafts but the last
        k = min(k, context.n_ctx - len(tokens) + 1)
        if k <= 0 or not tokens:
            return EMPTY
        if not self.probe and context.too_dear(self.single_s):
            self.off = "cost"
            return EMPTY
        if self.prefill_s is None:
            start = time.perf_counter()
            context.sync(tokens)
            self.prefill_s = time.perf_counter() - start
            self.batch_s -= self.prefill_s  # the caller adds the whole call back
        else:
            context.sync(tokens)
        return np.asarray(context.greedy(k), dtype=np.intc)
