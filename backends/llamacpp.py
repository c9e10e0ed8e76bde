"""llama.cpp through llama-cpp-python: GGUF models, chat templates from the file.

Segments: llama.cpp cannot hand activations between runtimes, so a GGUF "segment" is a range of
transformer blocks and the only split it can execute is the one llama.cpp does itself — the
*last* ``n_gpu_layers`` blocks on the GPU, the rest on the CPU. A plan for a GGUF model is
therefore that count: a ``gpu`` target supports a segment only when it runs to the last block,
and :func:`n_gpu_layers_for` turns the GPU segment into llama.cpp's parameter.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from edgepilot.backends.base import (
    Backend,
    BackendUnavailable,
    Executable,
    Segment,
    Support,
    Target,
    TensorSpec,
)
from edgepilot.backends.llamacpp_options import LlamacppSection
from edgepilot.backends.native_log import route_llama_logs
from edgepilot.errors import BackendError, CommandError
from edgepilot.formats.gguf_info import GgufInfo, read_gguf_info

log = logging.getLogger(__name__)
T = TypeVar("T")

# the file's own GGUF types; the dispatcher never re-quantizes a GGUF
NATIVE = "native"


class LlamaThread:
    """The one thread that runs every llama.cpp computation of the process.

    llama.cpp's CPU backend is built with OpenMP here: each thread that starts a parallel
    computation becomes the master of its own pool of OpenMP threads, kept for reuse. Once the
    process holds more OpenMP threads than cores (two masters with two threads each on a 2-core
    board), libgomp throttles its spin-waits and every barrier, hundreds per token, goes through
    a futex. Multi-threaded decode then ran 3x slower (27 vs 8.6 ms/token for SmolLM2-135M on
    2 threads) in the daemon, whose requests landed on whichever executor thread was free and
    whose plan measured on yet another, while 1 thread (no parallel region) was unaffected: the
    plan chose 1 thread and decode ran at 0.5x raw. One master keeps one pool.

    Requests to llama.cpp are serialised per device anyway, so one thread costs no concurrency
    on a CPU board. Callers on this thread run directly; others hand the call over and wait.
    """

    def __init__(self) -> None:
        self._ident: int | None = None
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="llama.cpp", initializer=self._mark)

    def _mark(self) -> None:
        self._ident = threading.get_ident()

    def here(self) -> bool:
        """Whether the caller is the llama.cpp thread."""
        return threading.get_ident() == self._ident

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the llama.cpp thread (its exceptions re-raised here)."""
        if self.here():
            return fn(*args, **kwargs)
        return self.executor.submit(fn, *args, **kwargs).result()

    def iterate(self, start: Callable[[], Iterator[T]]) -> Iterator[T]:
        """The items of ``start()``, produced on the llama.cpp thread.

        From another thread the items are handed over one by one; a consumer that stops early
        stops the producer after its current item and waits for it to leave llama.cpp."""
        if self.here():
            yield from start()
            return
        items: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        stop = threading.Event()

        def produce() -> None:
            try:
                with contextlib.closing(iter(start())) as it:  # type: ignore[type-var]
                    for item in it:
                        items.put(("item", item))
                        if stop.is_set():
                            break
                items.put(("end", None))
            except BaseException as exc:  # re-raised in the consumer
                items.put(("error", exc))

        fut = self.executor.submit(produce)
        try:
            while True:
                kind, item = items.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise item
                yield item
        finally:
            stop.set()
            fut.result()


LLAMA_THREAD = LlamaThread()


def _import() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise BackendUnavailable(
            f"llama-cpp-python is not installed ({exc}); pip install 'edgepilot[gguf]'") from None
    route_llama_logs(llama_cpp)
    return llama_cpp


_counting_class: Any = None


def _counting_llama(llama_cpp: Any) -> Any:
    """``llama_cpp.Llama`` that records what it samples during one generation.

    llama-cpp-python reports usage only in its non-streamed response, where completion tokens are
    the tokens it kept: every sampled token except an end-of-generation one (a token that
    completes a ``stop`` string is kept, and counted). A stream carries no usage, and the sampler
    alone cannot tell an EOG stop from a stop string (both end with ``finish_reason="stop"``), so
    the sampled ids themselves are kept here and :func:`usage_of` applies the same rule.
    The time of each sample is kept too: their spacing is the decode speed the client got.
    """
    global _counting_class
    if _counting_class is None:
        class CountingLlama(llama_cpp.Llama):  # type: ignore[misc, name-defined]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.sampled: list[int] = []
                self.sample_times: list[float] = []
                self.prompt_len = 0

            def sample(self, *args: Any, **kwargs: Any) -> Any:
                token = super().sample(*args, **kwargs)
                if not self.sampled:
                    # generate() evaluates the whole prompt before its first sample
                    self.prompt_len = int(self.n_tokens)
                self.sampled.append(int(token))
                self.sample_times.append(time.perf_counter())
                return token

        _counting_class = CountingLlama
    return _counting_class


def usage_of(llm: Any, *, empty_prompt: bool = False) -> dict[str, int]:
    """Usage of the last generation of a counting llama, as llama.cpp's own response counts it.

    ``empty_prompt``: llama-cpp-python seeds the completion of an empty prompt with BOS and
    counts it as a completion token; the same is done here.
    """
    llama_cpp = _import()
    sampled = list(llm.sampled)
    completion = len(sampled)
    if sampled and llama_cpp.llama_vocab_is_eog(llm._model.vocab, sampled[-1]):
        completion -= 1  # the EOG token ends generation and is not part of the completion
    completion += 1 if empty_prompt else 0
    prompt = int(llm.prompt_len)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class ThreadGovernor(Protocol):
    """Who decides a loaded model's thread count request by request, and hears how fast each
    request decoded (the GGUF plan and its live check). Called under the model's lock, in the
    worker thread that runs the request: it must not wait on anything slow."""

    def threads_for_request(self) -> int | None:
        """The thread count for the next request (None: leave it as it is)."""

    def observed(self, n_threads: int, decode_ms_per_token: float, tokens: int) -> None:
        """One request decoded ``tokens`` tokens after its first at ``decode_ms_per_token``."""


class TokenStream:
    """Chunks of one streamed generation; :attr:`usage` is set once they are exhausted.

    Iterating holds the model's lock, so the counts read at the end belong to this stream.
    """

    def __init__(self, exe: LlamaExecutable, start: Callable[[], Iterator[Any]],
                 empty_prompt: bool = False, field: str = "prompt") -> None:
        self.field = field
        self._exe = exe
        self._start = start
        self._empty_prompt = empty_prompt
        self.usage: dict[str, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        exe = self._exe
        with exe.lock:
            exe.begin_request()
            with refused_as_bad_request(self.field):
                yield from LLAMA_THREAD.iterate(self._start)
            self.usage = usage_of(exe.llm, empty_prompt=self._empty_prompt)
            exe.end_request()


def _cancellable(params: dict[str, Any], cancel: threading.Event | None,
                 eos: int) -> dict[str, Any]:
    """``params`` with a logits processor that ends the generation at the next token once
    ``cancel`` is set (a client gone, a shutdown past its drain deadline): only end-of-sequence
    stays possible. Without it a generation that yields nothing for a while (held-back partial
    UTF-8, a non-streamed request) runs to ``max_tokens`` and keeps the process from exiting.
    (Raising instead does not work: llama-cpp-python calls processors from a C callback that
    prints exceptions and carries on.)"""
    if cancel is None:
        return params

    def check(input_ids: Any, scores: Any) -> Any:
        if cancel.is_set():
            scores[:] = -np.inf
            scores[eos] = 0.0
        return scores

    llama_cpp = _import()
    processors = llama_cpp.LogitsProcessorList([*(params.get("logits_processor") or []), check])
    return {**params, "logits_processor": processors}


@contextlib.contextmanager
def refused_as_bad_request(field: str) -> Iterator[None]:
    """llama-cpp-python refuses a request it cannot take (a prompt longer than the context
    window, an option the model was not loaded for) with ``ValueError``: that is the client's
    input, so it becomes a 400 naming the field, not an internal error."""
    try:
        yield
    except ValueError as exc:
        raise CommandError(f"llama.cpp refused the request: {exc}; shorten the input or raise "
                           "n_ctx ([backends.llamacpp] or the model's n_ctx)",
                           field=field) from None


def n_gpu_layers_for(segment_layers: tuple[int, int] | None, n_layers: int) -> int:
    """llama.cpp's ``n_gpu_layers`` for a GPU segment covering blocks ``[a, b)``.

    llama.cpp offloads the last N blocks, so only suffixes can be placed: ``b`` must be
    ``n_layers``; N = ``n_layers - a``. ``None`` (the whole model) means every block.
    """
    if segment_layers is None:
        return n_layers
    a, b = segment_layers
    if not 0 <= a < b <= n_layers:
        raise BackendError(f"GGUF segment layers [{a}, {b}) outside 0..{n_layers}",
                           field="segment.layers")
    if b != n_layers:
        raise BackendError(
            f"llama.cpp offloads only the last blocks to the GPU; segment [{a}, {b}) must end "
            f"at block {n_layers}", field="segment.layers")
    return n_layers - a


class LlamaExecutable(Executable):
    """A loaded GGUF: tensor ``run`` (tokens -> last logits) plus chat/completion calls.

    Calls are serialised by an internal lock: one llama context must never run two requests.
    """

    def __init__(self, llm: Any, info: GgufInfo, target: Target, kv_type: str,
                 n_gpu_layers: int) -> None:
        self.llm = llm
        self.info = info
        self.target = target
        self.n_ctx = int(llm.n_ctx())  # llama.cpp pads the requested context
        self.kv_type = kv_type
        self.n_gpu_layers = n_gpu_layers
        self.n_threads = int(llm.n_threads)
        self.governor: ThreadGovernor | None = None
        self.lock = threading.Lock()
        self.inputs = [TensorSpec("tokens", "int32", (None,))]
        self.outputs = [TensorSpec("logits", "float32", (int(llm.n_vocab()),))]

    @property
    def memory_bytes(self) -> int:
        return self.info.estimate_bytes(self.n_ctx, self.kv_type)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Evaluate ``tokens`` from an empty context; return the last position's logits."""
        if "tokens" not in inputs:
            raise BackendError("GGUF models take one input 'tokens' (int32 token ids)",
                               field="inputs")
        tokens = [int(t) for t in np.asarray(inputs["tokens"]).reshape(-1)]
        if not tokens or len(tokens) > self.n_ctx:
            raise BackendError(f"'tokens' must hold 1..{self.n_ctx} ids", field="inputs.tokens")
        llama_cpp = _import()
        def last_logits() -> np.ndarray:
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
        llama_cpp = _import()
        llm = self.llm
        llama_cpp.llama_set_n_threads(llm.ctx, n_threads, n_threads)
        llm.n_threads = llm.n_threads_batch = n_threads
        llm.context_params.n_threads = llm.context_params.n_threads_batch = n_threads
        self.n_threads = n_threads

    def begin_request(self) -> None:
        """Under the lock, before a generation: the governor's thread count, fresh counters."""
        if self.governor is not None:
            n = self.governor.threads_for_request()
            if n and n != self.n_threads:
                self._apply_threads(n)
        self.llm.sampled = []
        self.llm.sample_times = []

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
        params = _cancellable(params, cancel, int(self.llm.token_eos()))
        if params.get("stream"):
            return TokenStream(self, functools.partial(
                self.llm.create_chat_completion, messages=messages, **params), field="messages")
        with self.lock, refused_as_bad_request("messages"):
            self.begin_request()
            out = LLAMA_THREAD.call(self.llm.create_chat_completion, messages=messages,
                                    **params)
            self.end_request()
            return out

    def complete(self, prompt: str, *, cancel: threading.Event | None = None,
                 **params: Any) -> Any:
        """llama-cpp-python's ``create_completion`` (a dict, or a :class:`TokenStream`);
        ``cancel`` as for :meth:`chat`."""
        params = _cancellable(params, cancel, int(self.llm.token_eos()))
        if params.get("stream"):
            return TokenStream(self, functools.partial(
                self.llm.create_completion, prompt=prompt, **params), empty_prompt=not prompt)
        with self.lock, refused_as_bad_request("prompt"):
            self.begin_request()
            out = LLAMA_THREAD.call(self.llm.create_completion, prompt=prompt, **params)
            self.end_request()
            return out

    def close(self) -> None:
        with self.lock:
            close = getattr(self.llm, "close", None)
            if close is not None:
                LLAMA_THREAD.call(close)


class LlamaCppBackend(Backend):
    """GGUF on llama.cpp; devices ``cpu`` and (GPU builds) ``gpu``; precision = the file's."""

    name = "llamacpp"

    def __init__(self, settings: LlamacppSection | None = None) -> None:
        self.settings = settings or LlamacppSection()

    def version(self) -> str | None:
        return str(_import().__version__)

    def gpu_offload(self) -> bool:
        return bool(_import().llama_supports_gpu_offload())

    def probe(self) -> list[Target]:
        _import()
        targets = [Target(self.name, "cpu", NATIVE)]
        if self.gpu_offload():
            targets.append(Target(self.name, "gpu", NATIVE))
        return targets

    def supports(self, segment: Segment, target: Target) -> Support:
        if segment.kind != "gguf":
            return Support(False, f"llama.cpp runs GGUF files, not {segment.kind}")
        if target.device not in ("cpu", "gpu"):
            return Support(False, f"llama.cpp devices are cpu and gpu, not {target.device!r}")
        if target.device == "gpu" and not self.gpu_offload():
            return Support(False, "this llama-cpp-python build has no GPU offload")
        info = read_gguf_info(segment.model_path)
        if target.precision not in (NATIVE, info.weight_type):
            return Support(False, f"GGUF weights are {info.weight_type}; llama.cpp does not "
                                  f"re-quantize to {target.precision}")
        if target.device == "gpu":
            try:
                n_gpu_layers_for(segment.layers, info.n_layers)
            except BackendError as exc:
                return Support(False, exc.message)
        return Support(True)

    def compile(self, segment: Segment, target: Target) -> Executable:
        support = self.supports(segment, target)
        if not support:
            raise BackendError(f"{target} cannot run {segment.model_path.name}: {support.reason}")
        info = read_gguf_info(segment.model_path)
        n_gpu = n_gpu_layers_for(segment.layers, info.n_layers) if target.device == "gpu" else 0
        return self.open(segment.model_path, n_gpu_layers=n_gpu, info=info)

    def kv_type_ids(self) -> tuple[int, int]:
        llama_cpp = _import()
        ids = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16,
               "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}
        kv = self.settings.kv_cache_type
        if kv in ("q8_0", "q4_0") and not self.settings.flash_attn:
            # llama.cpp refuses a quantized V cache without flash attention; say so up front
            raise BackendError(f"kv_cache_type = {kv!r} needs flash_attn = true "
                               "([backends.llamacpp])", field="backends.llamacpp.kv_cache_type")
        return ids[kv], ids[kv]

    def open(self, path: Path, *, n_ctx: int | None = None, n_gpu_layers: int | None = None,
             info: GgufInfo | None = None) -> LlamaExecutable:
        """Load ``path`` with the configured options (``n_ctx``/``n_gpu_layers`` override)."""
        llama_cpp = _import()
        s = self.settings
        info = info or read_gguf_info(path)
        ctx = n_ctx or s.n_ctx
        n_gpu = s.n_gpu_layers if n_gpu_layers is None else n_gpu_layers
        type_k, type_v = self.kv_type_ids()
        try:
            llm = LLAMA_THREAD.call(
                _counting_llama(llama_cpp),
                model_path=str(path), n_ctx=ctx, n_gpu_layers=n_gpu,
                n_threads=s.n_threads or os.cpu_count() or 1, use_mmap=s.use_mmap,
                use_mlock=s.use_mlock, flash_attn=s.flash_attn, type_k=type_k, type_v=type_v,
                seed=0, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise BackendError(f"llama.cpp could not load {path.name}: {exc}",
                               field="file") from None
        device = "gpu" if n_gpu and self.gpu_offload() else "cpu"
        log.info("llama.cpp loaded %s (ctx %d, n_gpu_layers %d)", path.name, ctx, n_gpu)
        return LlamaExecutable(llm, info, Target(self.name, device, info.weight_type),
                               s.kv_cache_type, n_gpu)
