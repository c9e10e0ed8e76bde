"""A loaded GGUF that serves several chats at once (``[backends.llamacpp] parallel = N``).

Each request keeps llama-cpp-python's whole high-level path — the file's chat template, prompt
tokenization, stop strings, held-back partial UTF-8, the response and chunk shapes, usage — and
only the token loop is replaced: llama-cpp-python's ``create_chat_completion`` and
``create_completion`` run against a per-request view of the shared ``Llama`` whose
``generate`` hands the prompt to the :class:`~.batch.BatchEngine` and yields the tokens
it samples for this request's sequence. The view carries what is per request (seed, sampler,
the tokens so far, the counts behind ``usage``); everything else is the shared model's.

Calls come from several threads at once (the serving layer admits up to N); the formatting runs
in the caller's thread, the computation on the llama.cpp thread, one step for all.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from edgepilot.backends.base import Target
from edgepilot.backends.llamacpp.batch import BatchEngine, BatchSequence, StepGuard
from edgepilot.backends.llamacpp.executable import LlamaExecutable
from edgepilot.backends.llamacpp.logprobs import (
    LogprobRecorder,
    attach,
    streamed,
)
from edgepilot.backends.llamacpp.processors import restore_text, with_processors
from edgepilot.backends.llamacpp.runtime import (
    LLAMA_THREAD,
    import_llama_cpp,
    usage_of,
    with_cached,
    with_stop_requests,
)
from edgepilot.errors import BackendError, CommandError, ContextOverflow
from edgepilot.formats.gguf_info import GgufInfo

# llama.cpp rounds each sequence's share of the context up to this many tokens
SHARE_ALIGN = 256

_view_class: Any = None


def _request_view(llama_cpp: Any) -> Any:
    """The class of a request's view of a shared ``Llama`` (built once llama_cpp is imported)."""
    global _view_class
    if _view_class is not None:
        return _view_class
    base = llama_cpp.Llama

    class RequestView:
        # llama-cpp-python's own request handling, bound to the view: its calls to
        # self.generate / self.set_seed / self._n_ctx land here, the rest on the model
        create_chat_completion = base.create_chat_completion
        create_completion = base.create_completion
        _create_completion = base._create_completion
        _init_sampler = base._init_sampler

        def __init__(self, llm: Any, engine: BatchEngine,
                     cancel: threading.Event | None) -> None:
            self._llm = llm
            self._engine = engine
            self._cancel = cancel
            self._seed = llm._seed
            self._n_ctx = engine.n_ctx_seq  # this request's share of the context
            self._no_scores = np.zeros((1, llm.n_vocab()), dtype=np.single)
            self.seq: BatchSequence | None = None
            self.sampled: list[int] = []
            self.prompt_len = 0
            self.prompt_cached = 0  # a sequence reads its whole prompt

        def __getattr__(self, name: str) -> Any:
            return getattr(self._llm, name)

        def set_seed(self, seed: int) -> None:
            self._seed = seed

        def n_ctx(self) -> int:
            return int(self._n_ctx)

        @property
        def _input_ids(self) -> np.ndarray:
            # the tokens in this sequence's cache, for logits processors (llama.cpp thread)
            return np.asarray(self.seq.ids if self.seq else [], dtype=np.intc)

        @property
        def _scores(self) -> np.ndarray:
            # llama-cpp-python keeps no scores without logits_all either (it passes a stale
            # row to stopping criteria); this view has none to pass
            return self._no_scores

        def unsample(self) -> None:
            if self.sampled:  # the token a stopping criterion dropped (runtime.py)
                self.sampled.pop()

        def generate(self, tokens: Any, *, stopping_criteria: Any = None, reset: bool = True,
                     **sampling: Any) -> Iterator[int]:
            """``Llama.generate`` for one sequence of the engine: prompt in, sampled ids out."""
            received = [0]  # tokens read from the engine (it samples ahead of this reader)
            stopping_criteria = with_stop_requests(
                import_llama_cpp(), {**sampling, "stopping_criteria": stopping_criteria},
                lambda: received[0], self.unsample)["stopping_criteria"]
            sampler = self._init_sampler(**sampling)
            # no max_tokens here: llama-cpp-python decides when it has enough (a token that
            # ends inside a UTF-8 character is not counted yet), and closes this generator
            seq = BatchSequence(list(tokens), sampler, cancel=self._cancel)
            self.seq, self.prompt_len = seq, len(seq.prompt)
            try:
                self._engine.submit(seq)
            except BaseException:
                sampler.close()
                raise
            try:
                while True:
                    kind, value = seq.out.get()
                    if kind == "token":
                        self.sampled.append(value)
                        received[0] += 1
                        if stopping_criteria is not None and stopping_criteria(
                                np.asarray(seq.ids, dtype=np.intc), self._no_scores[0]):
                            return
                        yield value
                    elif kind == "end":
                        if value == "cancelled":
                            # like the one-at-a-time path: the generation ends as if the
                            # model had said end-of-sequence (finish_reason "stop")
                            eos = int(self._llm.token_eos())
                            self.sampled.append(eos)
                            yield eos
                        return
                    else:
                        raise value
            finally:
                self._engine.release(seq)

    _view_class = RequestView
    return _view_class


class BatchTokenStream:
    """Chunks of one streamed generation of a parallel model; :attr:`usage` once exhausted."""

    def __init__(self, exe: LlamaBatchExecutable, view: Any, start: Callable[[], Iterator[Any]],
                 *, empty_prompt: bool = False, field: str = "prompt",
                 logprobs: LogprobRecorder | None = None) -> None:
        self.field = field
        self._logprobs = logprobs  # each chunk then carries its tokens' logprobs
        self._exe = exe
        self._view = view
        self._start = start
        self._empty_prompt = empty_prompt
        self.usage: dict[str, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        with self._exe.refused(self.field):
            yield from streamed(self._start(), self._logprobs)
        self.usage = usage_of(self._view, empty_prompt=self._empty_prompt)
        self._exe.report(self._view)


class LlamaBatchExecutable(LlamaExecutable):
    """A GGUF serving up to ``parallel`` generations at once as sequences of one context.

    The multi-sequence context replaces the model's own at the first request (a model loaded
    only to be measured never makes it). ``max_concurrency`` tells the serving layer to call
    :meth:`chat`/:meth:`complete` from several threads and to set :attr:`step_guard`.
    """

    def __init__(self, llm: Any, info: GgufInfo, target: Target, kv_type: str,
                 n_gpu_layers: int, parallel: int) -> None:
        super().__init__(llm, info, target, kv_type, n_gpu_layers)
        self.parallel = parallel
        self.max_concurrency = parallel
        # llama.cpp gives each sequence n_ctx / parallel rounded up to a multiple of 256
        share = -(-(int(llm.n_ctx()) // parallel) // SHARE_ALIGN) * SHARE_ALIGN
        self.n_ctx = share * parallel
        self._engine: BatchEngine | None = None
        self._engine_lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def engine(self) -> BatchEngine:
        """The batch engine, made (with its context) on first use."""
        with self._engine_lock:
            if self._engine is None:
                self._engine = BatchEngine.create(self.llm, self.parallel, self._step_guard,
                                                  self._between_requests)
                self.n_ctx = int(self.llm.n_ctx())  # the context llama.cpp made
            return self._engine

    @property
    def progress(self) -> tuple[int, int, float]:
        engine = self._engine
        done, now, slowest = super().progress
        if engine is None:
            return done, now, slowest
        return (done + engine.tokens_done, max(now, engine.step_tokens),
                max(slowest, engine.slowest_token_s))

    def _step_guard(self) -> StepGuard | None:
        return self.step_guard

    def _between_requests(self) -> None:
        # on the llama.cpp thread, no sequence running: the governor's thread count applies
        if self.governor is not None:
            n = self.governor.threads_for_request()
            if n and n != self.n_threads:
                self._apply_threads(n)

    @property
    def n_ctx_seq(self) -> int:
        """Each sequence's share of the context (tokens of prompt plus completion)."""
        return self.engine().n_ctx_seq

    @property
    def executor(self) -> concurrent.futures.Executor:
        """Threads for callers that run this model's calls in its own executor: each waits for
        its tokens, so none of them may be the llama.cpp thread (it computes them)."""
        with self._engine_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.parallel, thread_name_prefix="llama.cpp-request")
            return self._pool

    def set_threads(self, n_threads: int) -> None:
        """From the next step on (applied between steps, on the llama.cpp thread)."""
        LLAMA_THREAD.call(self._apply_threads, n_threads)

    def adapter_of(self, params: dict[str, Any]) -> str:
        """Adapters are applied per context, and the N sequences share one: a parallel model
        serves the base only (refused by name, before anything runs)."""
        name = params.pop("adapter", None)
        if name:
            raise CommandError(f"adapter {name!r}: LoRA adapters are served with "
                               "[backends.llamacpp] parallel = 1 only", field="adapter")
        return ""

    def _view(self, cancel: threading.Event | None) -> Any:
        if LLAMA_THREAD.here():
            raise RuntimeError("a parallel GGUF model must not be called on the llama.cpp "
                               "thread: that thread computes the tokens it would wait for")
        return _request_view(import_llama_cpp())(self.llm, self.engine(), cancel)

    @contextlib.contextmanager
    def refused(self, field: str) -> Iterator[None]:
        """llama-cpp-python's ValueError (a prompt over the sequence's share of the context, an
        option the model was not loaded for) as a 400 naming ``field`` and the share."""
        try:
            yield
        except ValueError as exc:
            share = self._engine.n_ctx_seq if self._engine is not None else self.n_ctx
            over = "context window" in str(exc)
            kind = ContextOverflow if over else CommandError
            what = f"the request exceeds the available context size ({exc})" if over \
                else str(exc)
            raise kind(
                f"llama.cpp refused the request: {what}; each of the {self.parallel} parallel "
                f"sequences holds {share} tokens of the context: shorten the input, or raise "
                "n_ctx or lower [backends.llamacpp] parallel", field=field) from None

    def _detokenize_of(self, view: Any) -> Any:
        prompt = [int(t) for t in view.seq.prompt] if view.seq is not None else []
        return lambda tokens: bytes(self.llm.detokenize(list(tokens), prev_tokens=prompt))

    def report(self, view: Any) -> None:
        # the governor compares decode speeds with single-stream measurements: only a request
        # that never shared a step with another is comparable
        seq = view.seq
        if self.governor is None or seq is None or seq.shared or len(seq.times) < 2:
            return
        ms = (seq.times[-1] - seq.times[0]) * 1e3 / (len(seq.times) - 1)
        self.governor.observed(self.n_threads, ms, len(seq.times) - 1)

    def chat(self, messages: list[dict[str, Any]], *, cancel: threading.Event | None = None,
             **params: Any) -> Any:
        """llama-cpp-python's ``create_chat_completion`` as one sequence of the batch: a dict,
        or (``stream=True``) a :class:`BatchTokenStream`. Setting ``cancel`` ends the
        generation at the next step (finish_reason "stop")."""
        self.adapter_of(params)
        view = self._view(cancel)
        params, logprobs = with_processors(params, self.llm, None, recorded=view)
        if params.get("stream"):
            return BatchTokenStream(self, view, lambda: view.create_chat_completion(
                messages=messages, **params), field="messages", logprobs=logprobs)
        with self.refused("messages"):
            out = view.create_chat_completion(messages=messages, **params)
        restore_text(out, params, view.sampled, self._detokenize_of(view), chat=True)
        self.report(view)
        if isinstance(out.get("usage"), dict):
            with_cached(out["usage"], view)
        return attach(out, logprobs, chat=True)

    def complete(self, prompt: str, *, cancel: threading.Event | None = None,
                 **params: Any) -> Any:
        """llama-cpp-python's ``create_completion`` as one sequence of the batch (a dict, or a
        :class:`BatchTokenStream`); ``cancel`` as for :meth:`chat`."""
        self.adapter_of(params)
        view = self._view(cancel)
        params, logprobs = with_processors(params, self.llm, None, recorded=view)
        if params.get("stream"):
            return BatchTokenStream(self, view, lambda: view.create_completion(
                prompt=prompt, **params), empty_prompt=not prompt, logprobs=logprobs)
        with self.refused("prompt"):
            out = view.create_completion(prompt=prompt, **params)
        restore_text(out, params, view.sampled, self._detokenize_of(view), chat=False)
        self.report(view)
        if isinstance(out.get("usage"), dict):
            with_cached(out["usage"], view)
        return attach(out, logprobs, chat=False)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Evaluate ``tokens`` in a free sequence; return the last position's logits."""
        if "tokens" not in inputs:
            raise BackendError("GGUF models take one input 'tokens' (int32 token ids)",
                               field="inputs")
        tokens = [int(t) for t in np.asarray(inputs["tokens"]).reshape(-1)]
        engine = self.engine()
        try:
            return {"logits": engine.logits(tokens)}
        except ValueError as exc:
            raise BackendError(str(exc), field="inputs.tokens") from None

    def close(self) -> None:
        with self._engine_lock:
            engine, self._engine = self._engine, None
            pool, self._pool = self._pool, None
        if engine is not None:
            engine.close()
        if pool is not None:
            pool.shutdown(wait=False)
        super().close()

