"""A loaded GGUF that runs one request at a time: llama-cpp-python's own generation on the
llama.cpp thread, under the model's lock (``[backends.llamacpp] parallel = 1``, the default).
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from edgepilot.backends.base import GenerativeExecutable, Target, TensorSpec
from edgepilot.backends.llamacpp.adapters import LoraSet
from edgepilot.backends.llamacpp.logprobs import (
    LogprobRecorder,
    attach,
    streamed,
)
from edgepilot.backends.llamacpp.processors import restore_text, with_processors
from edgepilot.backends.llamacpp.runtime import (
    LLAMA_THREAD,
    ThreadGovernor,
    import_llama_cpp,
    refused_as_bad_request,
    usage_of,
    with_cached,
)
from edgepilot.errors import BackendError, CommandError
from edgepilot.formats.gguf_info import GgufInfo


class TokenStream:
    """Chunks of one streamed generation; :attr:`usage` is set once they are exhausted.

    Iterating holds the model's lock, so the counts read at the end belong to this stream.
    """

    def __init__(self, exe: LlamaExecutable, start: Callable[[], Iterator[Any]],
                 empty_prompt: bool = False, field: str = "prompt", adapter: str = "",
                 logprobs: LogprobRecorder | None = None) -> None:
        self.field = field
        self.adapter = adapter
        self._exe = exe
        self._start = start
        self._empty_prompt = empty_prompt
        self._logprobs = logprobs  # each chunk then carries its tokens' logprobs
        self.usage: dict[str, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        exe = self._exe
        with exe.lock:
            exe.begin_request(self.adapter)
            with refused_as_bad_request(self.field):
                yield from streamed(LLAMA_THREAD.iterate(self._start), self._logprobs)
            self.usage = usage_of(exe.llm, empty_prompt=self._empty_prompt)
            exe.end_request()


class LlamaExecutable(GenerativeExecutable):
    """A loaded GGUF: tensor ``run`` (tokens -> last logits) plus chat/completion calls.

    Calls are serialised by an internal lock: one llama context must never run two requests.
    """

    n_ctx: int  # the context llama.cpp made (it pads the requested one)

    def __init__(self, llm: Any, info: GgufInfo, target: Target, kv_type: str,
                 n_gpu_layers: int) -> None:
        self.llm = llm
        self.info = info
        self.target = target
        self.n_ctx = int(llm.n_ctx())
        self.kv_type = kv_type
        self.n_gpu_layers = n_gpu_layers
        self.n_threads = int(llm.n_threads)
        self.governor: ThreadGovernor | None = None
        # LoRA adapters a request may pick (``[[models]] adapters``); None: the model has none
        self.adapters: LoraSet | None = None
        self.lock = threading.Lock()
        self.inputs = [TensorSpec("tokens", "int32", (None,))]
        self.outputs = [TensorSpec("logits", "float32", (int(llm.n_vocab()),))]

    @property
    def memory_bytes(self) -> int:
        return self.info.estimate_bytes(self.n_ctx, self.kv_type)

    @property
    def progress(self) -> tuple[int, int, float]:
        """(tokens decoded so far, tokens of the decode under way, slowest seconds per token of
        a step): the first grows while the model computes (the worker's heartbeat carries all
        three; a count that stops with requests in flight is a hang, a long prompt chunk may
        take longer than one token, and the slowest step sets how long is too long)."""
        llm = self.llm
        return (int(getattr(llm, "tokens_done", 0)), int(getattr(llm, "step_tokens", 0)),
                float(getattr(llm, "slowest_token_s", 0.0)))

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Evaluate ``tokens`` from an empty context; return the last position's logits."""
        if "tokens" not in inputs:
            raise BackendError("GGUF models take one input 'tokens' (int32 token ids)",
                               field="inputs")
        tokens = [int(t) for t in np.asarray(inputs["tokens"]).reshape(-1)]
        if not tokens or len(tokens) > self.n_ctx:
            raise BackendError(f"'tokens' must hold 1..{self.n_ctx} ids", field="inputs.tokens")
        llama_cpp = import_llama_cpp()
        def last_logits() -> np.ndarray:
            if self.llm.prefix_cache is not None:
                self.llm.prefix_cache.keep(self.llm)  # the conversation this overwrites
            self.llm.reset()
            self.llm.eval(tokens)
            # llama-cpp-python keeps no scores without logits_all; read the last row directly
            ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
            return np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),)).copy()

        with self.lock:
            logits = LLAMA_THREAD.call(last_logits)
        return {"logits": logits}

    @property
    def executor(self) -> concurrent.futures.Executor:
        """Where callers should run this model's calls (the llama.cpp thread: no hand-over)."""
        return LLAMA_THREAD.executor

    def set_threads(self, n_threads: int) -> None:
        """Run with ``n_threads`` for decode *and* prompt batches from the next request on."""
        with self.lock:
            self._apply_threads(n_threads)

    def _apply_threads(self, n_threads: int) -> None:
        # llama-cpp-python otherwise prefills with every core whatever n_threads says, so a
        # plan that chose fewer threads would only half apply
        llama_cpp = import_llama_cpp()
        llm = self.llm
        llama_cpp.llama_set_n_threads(llm.ctx, n_threads, n_threads)
        llm.n_threads = llm.n_threads_batch = n_threads
        llm.context_params.n_threads = llm.context_params.n_threads_batch = n_threads
        draft = getattr(llm, "draft_context", None)
        if draft is not None:  # speculative = "draft": the draft runs on the same cores
            draft.set_threads(n_threads)
        self.n_threads = n_threads

    def adapter_of(self, params: dict[str, Any]) -> str:
        """The adapter ``params`` asks for (removed from them; "" = none), checked."""
        name = params.pop("adapter", None)
        if self.adapters is None:
            if name:
                raise CommandError(f"model has no adapters, so not {name!r}; list them in its "
                                   "[[models]] entry: adapters = {{ name = \"file.gguf\" }}",
                                   field="adapter")
            return ""
        return self.adapters.check(name)

    def begin_request(self, adapter: str = "") -> None:
        """Under the lock, before a generation: the request's adapter, the governor's thread
        count, fresh counters."""
        if self.adapters is not None and adapter != self.adapters.active:
            LLAMA_THREAD.call(self._switch_adapter, adapter)
        if self.governor is not None:
            n = self.governor.threads_for_request()
            if n and n != self.n_threads:
                self._apply_threads(n)
        self.llm.sampled = []
        self.llm.sample_times = []

    def _switch_adapter(self, adapter: str) -> None:
        # the KV the context holds was computed under the other adapter: kept under its name,
        # then nothing of it is reused
        assert self.adapters is not None
        llm = self.llm
        cache = llm.prefix_cache
        if cache is not None:
            cache.keep(llm)
        self.adapters.apply(llm.ctx, adapter)
        llm.reset()
        if cache is not None:
            cache.adapter = self.adapters.tag(adapter)

    def end_request(self) -> None:
        """Under the lock, after a generation: tell the governor how fast it decoded (the
        spacing of the sampled tokens after the first: decode + sampling, no prefill)."""
        times = self.llm.sample_times
        if self.governor is None or len(times) < 2:
            return
        ms = (times[-1] - times[0]) * 1e3 / (len(times) - 1)
        self.governor.observed(self.n_threads, ms, len(times) - 1)

    def tokenize(self, text: str) -> list[int]:
        with self.lock:
            return list(self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def chat(self, messages: list[dict[str, Any]], *, cancel: threading.Event | None = None,
             **params: Any) -> Any:
        """llama-cpp-python's ``create_chat_completion``: a dict, or (``stream=True``) a
        :class:`TokenStream` of chunks whose ``usage`` is llama.cpp's count. Setting ``cancel``
        ends the generation at the next token (finish_reason "stop")."""
        adapter = self.adapter_of(params)
        params, logprobs = with_processors(params, self.llm, cancel)
        if params.get("stream"):
            return TokenStream(self, functools.partial(
                self.llm.create_chat_completion, messages=messages, **params), field="messages",
                adapter=adapter, logprobs=logprobs)
        with self.lock, refused_as_bad_request("messages"):
            self.begin_request(adapter)
            out = LLAMA_THREAD.call(self.llm.create_chat_completion, messages=messages,
                                    **params)
            self.end_request()
            restore_text(out, params, self.llm.sampled, self._detokenize, chat=True)
            return attach(self._with_cached(out), logprobs, chat=True)

    def complete(self, prompt: str, *, cancel: threading.Event | None = None,
                 **params: Any) -> Any:
        """llama-cpp-python's ``create_completion`` (a dict, or a :class:`TokenStream`);
        ``cancel`` as for :meth:`chat`."""
        adapter = self.adapter_of(params)
        params, logprobs = with_processors(params, self.llm, cancel)
        if params.get("stream"):
            return TokenStream(self, functools.partial(
                self.llm.create_completion, prompt=prompt, **params), empty_prompt=not prompt,
                adapter=adapter, logprobs=logprobs)
        with self.lock, refused_as_bad_request("prompt"):
            self.begin_request(adapter)
            out = LLAMA_THREAD.call(self.llm.create_completion, prompt=prompt, **params)
            self.end_request()
            restore_text(out, params, self.llm.sampled, self._detokenize, chat=False)
            return attach(self._with_cached(out), logprobs, chat=False)

    def _detokenize(self, tokens: list[int]) -> bytes:
        """The text bytes of generated ``tokens``, read after the prompt (a tokenizer's leading
        space depends on what comes before)."""
        prompt = [int(t) for t in self.llm._input_ids[:self.llm.prompt_len]]
        return bytes(self.llm.detokenize(list(tokens), prev_tokens=prompt))

    def _with_cached(self, out: Any) -> Any:
        if isinstance(out.get("usage"), dict):
            with_cached(out["usage"], self.llm)
        return out

    can_embed = True

    def embed(self, texts: Sequence[str], truncate: bool = True) -> list[list[float]]:
        """One L2-normalised vector per text: the model's pooled output when its GGUF names a
        pooling (an embedding model), else the mean of its last hidden states over the
        text's tokens. The context computes embeddings for this call only (llama.cpp's
        ``llama_set_embeddings``), so a generative model embeds without a second load. A text
        over the context is cut to it, or (``truncate`` False) a ContextOverflow naming
        ``input``."""
        with self.lock:
            return LLAMA_THREAD.call(self._embed, list(texts), truncate)

    def _embed(self, texts: list[str], truncate: bool) -> list[list[float]]:
        llama_cpp = import_llama_cpp()
        llm = self.llm
        was = bool(llm.context_params.embeddings)
        llama_cpp.llama_set_embeddings(llm.ctx, True)
        llm.context_params.embeddings = True
        try:
            out = []
            for text in texts:
                if not text:
                    raise CommandError("an input to embed is empty", field="input")
                with refused_as_bad_request("input"):
                    vec = np.asarray(llm.embed(text, normalize=False, truncate=truncate),
                                     dtype=np.float64)
                if vec.ndim == 2:  # one vector per token (no pooling): their mean
                    vec = vec.mean(axis=0)
                norm = float(np.linalg.norm(vec))
                out.append((vec / norm if norm else vec).astype(float).tolist())
            return out
        finally:
            llama_cpp.llama_set_embeddings(llm.ctx, was)
            llm.context_params.embeddings = was
            llm.n_tokens = 0  # the context now holds the last text: no prefix to reuse

    def close(self) -> None:
        with self.lock:
            cache = getattr(self.llm, "prefix_cache", None)
            if cache is not None:
                LLAMA_THREAD.call(cache.close, self.llm)  # spilled to disk when asked for
            draft = getattr(self.llm, "draft_context", None)
            if draft is not None:
                LLAMA_THREAD.call(draft.close)
                self.llm.draft_context = None
            close = getattr(self.llm, "close", None)
            if close is not None:
                LLAMA_THREAD.call(close)
