"""Continuous batching in one llama.cpp context: several generations decode together.

A context made with ``n_seq_max = N`` (and ``kv_unified = false``: each sequence its own share of
the KV cache, ``n_ctx / N`` tokens) holds N independent sequences. :class:`BatchEngine` runs them
with llama.cpp's own batch API: each step decodes one new token of every generating sequence in
one ``llama_decode`` (the weights are read once for all of them, which is where the throughput
comes from), and samples each sequence's next token with its own sampler chain. A request that
arrives while others generate is admitted at the next step; its prompt is read in chunks of
``n_batch`` tokens, each its own decode, so it never waits for the others to finish.

llama-cpp-python's ``Llama.generate`` cannot be used for this: it clears every sequence of the
context before each prompt. The high-level work (chat templates, stop strings, chunks) stays
llama-cpp-python's, see :mod:`edgepilot.backends.llamacpp.parallel`.

Threads: the computation runs on the llama.cpp thread (see ``LlamaThread``), one step per
hand-over. A driver thread takes the step guard (the serving layer's hold of the ``cpu`` device)
*before* handing the step over, never while on the llama.cpp thread: whoever else holds the
device may be waiting for that thread.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgepilot.backends.llamacpp.runtime import LLAMA_THREAD, import_llama_cpp
from edgepilot.errors import BackendError, BusyError, ModelUnloading

log = logging.getLogger(__name__)

StepGuard = Callable[[], AbstractContextManager[None]]


@dataclass(eq=False)
class BatchSequence:
    """One generation inside the engine; tokens come out of :attr:`out` as they are sampled.

    Items of ``out``: ``("token", id)``; ``("end", reason)`` with reason ``"stop"`` (an
    end-of-generation token was the last item), ``"length"`` (the sequence's share of the
    context is full) or ``"cancelled"`` (``cancel`` was set); ``("error", exc)``.
    The engine owns ``sampler`` (a llama-cpp-python ``LlamaSampler``) once submitted and frees
    it on the llama.cpp thread, where it samples.
    """

    prompt: list[int]
    sampler: Any
    cancel: threading.Event | None = None
    out: queue.SimpleQueue[tuple[str, Any]] = field(default_factory=queue.SimpleQueue)
    ids: list[int] = field(default_factory=list)        # tokens in the KV cache, in order
    times: list[float] = field(default_factory=list)    # when each token was sampled
    shared: bool = False    # decoded in one step together with another sequence
    closed: bool = False    # the consumer is gone: free the slot at the next step
    slot: int = -1
    pending: list[int] = field(default_factory=list)    # tokens to feed at the next step
    n_sampled: int = 0

    def reading_prompt(self) -> bool:
        return self.n_sampled == 0


class BatchEngine:
    """N parallel sequences of one llama.cpp context, stepped by a driver thread.

    ``guard()`` returns the context-manager factory each step is held under (None: no guard);
    ``on_idle_admit()`` runs on the llama.cpp thread when a request is admitted into an idle
    engine (the thread governor's moment to change the thread count between requests).
    Build it with :meth:`create` (it makes the context on the llama.cpp thread).
    """

    def __init__(self, llm: Any, ctx: Any, n_seq: int,
                 guard: Callable[[], StepGuard | None],
                 on_idle_admit: Callable[[], None] | None = None) -> None:
        llama_cpp = import_llama_cpp()
        self._llama_cpp = llama_cpp
        self.ctx = ctx
        self.n_seq = n_seq
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(ctx.ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(ctx.ctx))
        self._vocab = llm._model.vocab
        self._n_vocab = int(llm.n_vocab())
        self._mem = llama_cpp.llama_get_memory(ctx.ctx)
        self._batch = llama_cpp.llama_batch_init(max(self.n_batch, n_seq), 0, 1)
        self._guard = guard
        self._on_idle_admit = on_idle_admit
        self._cond = threading.Condition()
        self._waiting: deque[BatchSequence] = deque()
        self._active: list[BatchSequence] = []     # touched on the llama.cpp thread only
        self._free = list(range(n_seq - 1, -1, -1))
        self._closing = False
        self._closed = False
        # instrumentation, for status and tests: the most sequences one decode held, decodes run
        self.max_batch_seqs = 0
        self.steps = 0
        # the hang watchdog's progress: tokens decoded, and those of the decode under way
        self.tokens_done = self.step_tokens = 0
        self.slowest_token_s = 0.0  # the slowest time per token of one decode (the watchdog's)
        self._driver = threading.Thread(target=self._drive, name="llama.cpp-batch", daemon=True)
        self._driver.start()

    @classmethod
    def create(cls, llm: Any, n_seq: int, guard: Callable[[], StepGuard | None],
               on_idle_admit: Callable[[], None] | None = None) -> BatchEngine:
        """Give ``llm`` a context of ``n_seq`` sequences (replacing its one-sequence context,
        so the KV cache is not held twice) and an engine that runs them."""
        def build() -> BatchEngine:
            from llama_cpp import _internals
            params = llm.context_params
            params.n_seq_max = n_seq
            # llama.cpp runs any batch of more than one token with n_threads_batch, and a step
            # of several sequences is one: the thread count chosen for decode must apply to it
            params.n_threads_batch = params.n_threads
            if hasattr(params, "kv_unified"):
                # one KV stream per sequence: attention reads only the sequence's own cells
                params.kv_unified = False
            try:
                ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=False)
            except ValueError as exc:
                raise BackendError(f"llama.cpp could not make a context of {n_seq} sequences "
                                   f"({exc}); lower [backends.llamacpp] parallel or n_ctx",
                                   field="backends.llamacpp.parallel") from None
            # made first and swapped after: a failure above leaves the model as it was
            old, llm._ctx = llm._ctx, ctx
            old.close()
            return cls(llm, ctx, n_seq, guard, on_idle_admit)
        return LLAMA_THREAD.call(build)

    # ---- any thread ------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        """Sequences waiting for a free one of the N."""
        with self._cond:
            return len(self._waiting)

    @property
    def running(self) -> int:
        """Sequences holding one of the N (reading their prompt or generating)."""
        return len(self._active)

    def submit(self, seq: BatchSequence) -> None:
        """Queue ``seq``; it is admitted at the next step that has a free sequence."""
        if not seq.prompt:
            raise ValueError("the prompt is empty: llama.cpp needs at least one token")
        if len(seq.prompt) >= self.n_ctx_seq:
            raise ValueError(f"the prompt has {len(seq.prompt)} tokens; each of the "
                             f"{self.n_seq} parallel sequences holds {self.n_ctx_seq}")
        with self._cond:
            if self._closing:
                raise ModelUnloading("the model is being unloaded; retry", field="model")
            self._waiting.append(seq)
            self._cond.notify_all()

    def release(self, seq: BatchSequence) -> None:
        """The consumer is done with ``seq`` (finished, stopped early or gone)."""
        seq.closed = True
        with self._cond:
            self._cond.notify_all()

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Evaluate ``tokens`` in a free sequence and return the last position's logits.

        Runs on the llama.cpp thread between two steps, without the step guard: the caller
        holds the device already. BusyError when every sequence is generating."""
        if not 0 < len(tokens) <= self.n_ctx_seq:
            raise ValueError(f"'tokens' must hold 1..{self.n_ctx_seq} ids (each of the "
                             f"{self.n_seq} parallel sequences' share of the context)")

        def now() -> np.ndarray:
            if self._closed or not self._free:
                raise BusyError(f"all {self.n_seq} parallel sequences of this model are "
                                "generating; retry later", field="model")
            slot = self._free.pop()
            try:
                pos = 0
                for i in range(0, len(tokens), self.n_batch):
                    chunk = list(tokens[i:i + self.n_batch])
                    self._decode_chunk(slot, chunk, pos)
                    pos += len(chunk)
                ptr = self._llama_cpp.llama_get_logits_ith(self.ctx.ctx, len(chunk) - 1)
                return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()
            finally:
                self._llama_cpp.llama_memory_seq_rm(self._mem, slot, -1, -1)
                self._free.append(slot)
        return LLAMA_THREAD.call(now)

    def close(self) -> None:
        """Stop stepping; every queued or running sequence ends with an error. Safe while the
        caller holds the device (the driver is not waited for: it may be waiting for it)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        LLAMA_THREAD.call(self._teardown)

    # ---- driver thread -----------------------------------------------------------------------
    def _drive(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not self._waiting and not self._active:
                    self._cond.wait()
                if self._closing:
                    return
            factory = self._guard() or contextlib.nullcontext
            try:
                with factory():
                    if self._closing:
                        return
                    LLAMA_THREAD.call(self._step)
            except Exception as exc:  # told to every sequence, not lost
                log.exception("llama.cpp batch step failed")
                LLAMA_THREAD.call(self._fail_active, exc)

    # ---- llama.cpp thread --------------------------------------------------------------------
    def _step(self) -> None:
        if self._closed:
            return
        for seq in list(self._active):
            if seq.closed:
                self._leave(seq, None)
            elif seq.cancel is not None and seq.cancel.is_set():
                self._leave(seq, ("end", "cancelled"))
        self._admit()
        # prompts first, each its own decode (a prompt reads the same alone or not), then
        # one decode holding the next token of every generating sequence
        budget = self.n_batch
        for seq in [s for s in self._active if s.reading_prompt()]:
            if budget <= 0:
                break
            chunk = seq.pending[:budget]
            budget -= len(chunk)
            try:
                self._decode_chunk(seq.slot, chunk, len(seq.ids))
            except (BackendError, BusyError) as exc:
                self._leave(seq, ("error", exc))
                continue
            seq.ids.extend(chunk)
            seq.pending = seq.pending[len(chunk):]
            if not seq.pending:
                self._sample(seq, len(chunk) - 1)
        generating = [s for s in self._active if not s.reading_prompt() and s.pending]
        if not generating:
            return
        b = self._batch
        for i, seq in enumerate(generating):
            b.token[i] = seq.pending[0]
            b.pos[i] = len(seq.ids)
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq.slot
            b.logits[i] = True
        b.n_tokens = len(generating)
        self.step_tokens = len(generating)
        self.steps += 1
        self.max_batch_seqs = max(self.max_batch_seqs, len(generating))
        start = time.perf_counter()
        rc = self._llama_cpp.llama_decode(self.ctx.ctx, b)
        self._timed(start, len(generating))
        if rc != 0:
            self._fail(generating, rc)
            return
        for i, seq in enumerate(generating):
            seq.ids.append(seq.pending[0])
            seq.shared = seq.shared or len(generating) > 1
            self._sample(seq, i)

    def _timed(self, start: float, tokens: int) -> None:
        self.tokens_done += tokens
        self.slowest_token_s = max(self.slowest_token_s,
                                   (time.perf_counter() - start) / max(1, tokens))

    def _admit(self) -> None:
        idle = not self._active
        admitted = False
        with self._cond:
            while self._waiting and self._free:
                seq = self._waiting.popleft()
                if seq.closed or (seq.cancel is not None and seq.cancel.is_set()):
                    seq.out.put(("end", "cancelled"))
                    seq.sampler.close()
                    continue
                seq.slot = self._free.pop()
                seq.pending = list(seq.prompt)
                self._active.append(seq)
                admitted = True
        if idle and admitted and self._on_idle_admit is not None:
            self._on_idle_admit()

    def _decode_chunk(self, slot: int, chunk: list[int], pos: int) -> None:
        b = self._batch
        for i, tok in enumerate(chunk):
            b.token[i] = tok
            b.pos[i] = pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = slot
            b.logits[i] = i == len(chunk) - 1
        b.n_tokens = len(chunk)
        self.step_tokens = len(chunk)
        start = time.perf_counter()
        rc = int(self._llama_cpp.llama_decode(self.ctx.ctx, b))
        self.steps += 1
        self._timed(start, len(chunk))
        if rc == 1:  # no room in the KV cache now (llama.h): the other sequences hold it
            raise BusyError(f"llama.cpp found no room in the context for a prompt of "
                            f"{len(chunk)} tokens while other sequences hold it; retry",
                            field="model")
        if rc != 0:
            raise BackendError(f"llama.cpp could not decode a prompt of {len(chunk)} tokens "
                               f"(llama_decode returned {rc})", field="model")

    def _sample(self, seq: BatchSequence, index: int) -> None:
        llama_cpp = self._llama_cpp
        token = int(llama_cpp.llama_sampler_sample(seq.sampler.sampler, self.ctx.ctx, index))
        seq.n_sampled += 1
        seq.times.append(time.perf_counter())
        seq.out.put(("token", token))
        if llama_cpp.llama_vocab_is_eog(self._vocab, token):
            self._leave(seq, ("end", "stop"))
        elif len(seq.ids) >= self.n_ctx_seq:
            self._leave(seq, ("end", "length"))
        else:
            seq.pending = [token]

    def _leave(self, seq: BatchSequence, last: tuple[str, Any] | None) -> None:
        """Free ``seq``'s cells and sequence id; ``last`` is its final item, if any."""
        if seq in self._active:
            self._active.remove(seq)
            self._llama_cpp.llama_memory_seq_rm(self._mem, seq.slot, -1, -1)
            self._free.append(seq.slot)
        seq.sampler.close()
        seq.pending = []
        if last is not None:
            seq.out.put(last)

    def _fail(self, seqs: list[BatchSequence], rc: int) -> None:
        err = BackendError(f"llama.cpp could not decode a batch of {len(seqs)} sequence(s) "
                           f"(llama_decode returned {rc})", field="model")
        for seq in seqs:
            self._leave(seq, ("error", err))

    def _fail_active(self, exc: BaseException) -> None:
        for seq in list(self._active):
            self._leave(seq, ("error", exc))

    def _teardown(self) -> None:
        if self._closed:
            return
        self._closed = True
        err = ModelUnloading("the model was unloaded while generating; retry", field="model")
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
        for seq in waiting:
            seq.sampler.close()
            seq.out.put(("error", err))
        self._fail_active(err)
        self._llama_cpp.llama_batch_free(self._batch)
