"""The llama.cpp runtime as every GGUF executable uses it: the one thread that computes, the
import of llama-cpp-python, and the bookkeeping shared by the one-at-a-time and the parallel
executables (usage counted like llama.cpp's own response, cancellation, refused requests).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import numpy as np

from edgepilot.backends.base import BackendUnavailable
from edgepilot.backends.llamacpp.draft_model import DraftContext, DraftModel
from edgepilot.backends.llamacpp.lookup import PromptLookup
from edgepilot.backends.llamacpp.prefix_cache import PrefixCache, common_prefix
from edgepilot.backends.llamacpp.speculative import Drafter, draft_usage, eval_step, may_draft
from edgepilot.backends.native_log import route_llama_logs
from edgepilot.errors import CommandError, ContextOverflow

T = TypeVar("T")


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


def import_llama_cpp() -> Any:
    """The ``llama_cpp`` module, its native log routed to ours; BackendUnavailable without it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise BackendUnavailable(
            f"llama-cpp-python is not installed ({exc}); pip install 'edgepilot[gguf]'") from None
    route_llama_logs(llama_cpp)
    return llama_cpp


_counting_class: Any = None


def counting_llama(llama_cpp: Any) -> Any:
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
        class CountingLlama(llama_cpp.Llama):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.sampled: list[int] = []
                self.sample_times: list[float] = []
                self.prompt_len = 0
                # prompt tokens the last generation found in the KV cache (not evaluated)
                self.prompt_cached = 0
                self.prefix_cache: PrefixCache | None = None
                # the hang watchdog's progress: llama_decode calls and tokens done, and the
                # tokens of the call under way
                self.steps = self.tokens_done = self.step_tokens = 0
                # the slowest time per token of a step, measured here (the daemon's estimate
                # from heartbeats misses requests that end between two beats)
                self.slowest_token_s = 0.0
                # [backends.llamacpp] speculative; the draft model's context ("draft"; None:
                # none, or refused: draft_refused says why); the last generation's drafter
                # (None: it did not draft)
                self.speculative = "off"
                self.draft_context: DraftContext | None = None
                self.draft_refused = ""
                self.drafter: Drafter | None = None
                self.single_decode_s: float | None = None  # running, for the drafter

            def generate(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
                tokens = list(tokens)
                kwargs = with_stop_requests(llama_cpp, kwargs, lambda: len(self.sampled),
                                            self.unsample)
                cache = self.prefix_cache
                if cache is not None:
                    cache.before(self, tokens)
                self.prompt_cached = reused_prefix(self, tokens)
                drafter = self.drafter = drafter_for(self) if (
                    not args and may_draft(kwargs)) else None
                # llama-cpp-python's draft-model hook: drafts after each sampled token, the
                # batch verified position by position, the rejected part removed from the KV
                self.draft_model = drafter
                try:
                    return (yield from super().generate(tokens, *args, **kwargs))
                finally:
                    self.draft_model = None
                    if drafter is not None:
                        drafter.finish()
                    if cache is not None:
                        cache.dirty = True

            def eval(self, tokens: Any) -> None:
                # chunk by chunk, each counted: the watchdog's sign of progress (a long
                # prompt is many steps, not one silent one)
                tokens = list(tokens)
                self.step_tokens = len(tokens)
                start = time.perf_counter()
                if len(tokens) <= self.n_batch and eval_step(self, tokens):
                    # a draft batch or a single token of a drafting generation
                    self._counted(start, len(tokens))
                    return
                for i in range(0, len(tokens), self.n_batch):
                    chunk = tokens[i:i + self.n_batch]
                    self.step_tokens = len(chunk)
                    start = time.perf_counter()
                    self.eval_plain(chunk)
                    self._counted(start, len(chunk))

            def _counted(self, start: float, n: int) -> None:
                # one decode of n tokens done: the watchdog's progress and its slowest step
                self.slowest_token_s = max(self.slowest_token_s,
                                           (time.perf_counter() - start) / n)
                self.steps += 1
                self.tokens_done += n

            def unsample(self) -> None:
                if self.sampled:  # the token a stopping criterion dropped
                    self.sampled.pop()
                    self.sample_times.pop()

            def eval_plain(self, tokens: list[int]) -> None:
                super().eval(tokens)

            def sample(self, *args: Any, **kwargs: Any) -> Any:
                token = super().sample(*args, **kwargs)
                idx = kwargs.get("idx")
                drafter = self.draft_model
                if isinstance(drafter, Drafter) and idx is not None and \
                        idx + 1 < self.n_tokens:
                    # a drafted position follows: taken when the sampler chose the draft
                    drafter.checked(int(token) == int(self.input_ids[idx + 1]))
                if not self.sampled:
                    # generate() evaluates the whole prompt before its first sample
                    self.prompt_len = int(self.n_tokens)
                self.sampled.append(int(token))
                self.sample_times.append(time.perf_counter())
                return token

        _counting_class = CountingLlama
    return _counting_class


def drafter_for(llm: Any) -> Drafter | None:
    """A new drafter for the next generation of a counting llama, by its ``speculative``
    setting (None: off, or a draft model that was refused)."""
    if llm.speculative == "prompt_lookup":
        return PromptLookup(llm.single_decode_s)
    if llm.speculative == "draft" and llm.draft_context is not None:
        return DraftModel(llm.draft_context, llm.single_decode_s)
    return None


def reused_prefix(llm: Any, tokens: list[int]) -> int:
    """How many of ``tokens`` llama-cpp-python's ``generate`` will take from the KV cache
    instead of evaluating (its own rule: the common prefix with what the context holds, less
    the last prompt token unless the whole prompt was just decoded live)."""
    if not llm.n_tokens or not tokens:
        return 0
    held = np.asarray(llm._input_ids, dtype=np.int32)
    n = common_prefix(held, np.asarray(tokens, dtype=np.int32))
    if n == len(tokens) == len(held) and not llm._requires_eval:
        return n
    return n - 1 if n == len(tokens) else n


def usage_of(llm: Any, *, empty_prompt: bool = False) -> dict[str, Any]:
    """Usage of the last generation of a counting llama, as llama.cpp's own response counts it.

    ``empty_prompt``: llama-cpp-python seeds the completion of an empty prompt with BOS and
    counts it as a completion token; the same is done here.
    """
    llama_cpp = import_llama_cpp()
    sampled = list(llm.sampled)
    completion = len(sampled)
    if sampled and llama_cpp.llama_vocab_is_eog(llm._model.vocab, sampled[-1]):
        completion -= 1  # the EOG token ends generation and is not part of the completion
    completion += 1 if empty_prompt else 0
    prompt = int(llm.prompt_len)
    return with_cached({"prompt_tokens": prompt, "completion_tokens": completion,
                        "total_tokens": prompt + completion}, llm)


def with_cached(usage: dict[str, Any], llm: Any) -> dict[str, Any]:
    """``usage`` with OpenAI's ``prompt_tokens_details.cached_tokens``: the prompt tokens the
    last generation of ``llm`` reused from the KV cache instead of evaluating them, and (a
    generation that drafted) ``completion_tokens_details``: its drafted tokens taken and
    rejected."""
    usage["prompt_tokens_details"] = {"cached_tokens": int(getattr(llm, "prompt_cached", 0))}
    drafts = draft_usage(getattr(llm, "drafter", None))
    if drafts is not None:
        usage["completion_tokens_details"] = drafts
    return usage


class ThreadGovernor(Protocol):
    """Who decides a loaded model's thread count request by request, and hears how fast each
    request decoded (the GGUF plan and its live check). Called under the model's lock, in the
    worker thread that runs the request: it must not wait on anything slow."""

    def threads_for_request(self) -> int | None:
        """The thread count for the next request (None: leave it as it is)."""

    def observed(self, n_threads: int, decode_ms_per_token: float, tokens: int) -> None:
        """One request decoded ``tokens`` tokens after its first at ``decode_ms_per_token``."""



def with_stop_requests(llama_cpp: Any, kwargs: dict[str, Any], taken: Callable[[], int],
                       unsample: Callable[[], None]) -> dict[str, Any]:
    """``generate``'s keyword arguments with a stopping criterion for each logits processor
    that asks for one (``stop_requested``, see ``ending.cancellable``): llama-cpp-python's
    chat handlers pass ``stopping_criteria`` of their own making to ``generate``, never the
    caller's, so it is added where every generation passes. The criterion runs after a token
    was sampled (``taken``: how many so far, that one included), which is then dropped:
    ``unsample`` takes it off the caller's count."""
    asks = [p.stop_requested for p in kwargs.get("logits_processor") or []
            if hasattr(p, "stop_requested")]
    if not asks:
        return kwargs

    def stop(_ids: Any, _logits: Any) -> bool:
        at = min((i for a in asks if (i := a()) is not None), default=None)
        if at is not None and taken() - 1 >= at:
            unsample()
            return True
        return False

    criteria = llama_cpp.StoppingCriteriaList([*(kwargs.get("stopping_criteria") or []), stop])
    return {**kwargs, "stopping_criteria": criteria}


@contextlib.contextmanager
def refused_as_bad_request(field: str) -> Iterator[None]:
    """llama-cpp-python refuses a request it cannot take (a prompt longer than the context
    window, an option the model was not loaded for) with ``ValueError``: that is the client's
    input, so it becomes a 400 naming the field, not an internal error."""
    try:
        yield
    except ValueError as exc:
        if "batch size" in str(exc):  # an embedding's tokens are one batch: n_ctx is no help
            raise ContextOverflow(f"llama.cpp refused the request: {exc}; an input to embed is "
                                  "one batch of at most that many tokens: shorten it, or let "
                                  "it be cut to that (truncate: true)", field=field) from None
        over = "context window" in str(exc)
        kind = ContextOverflow if over else CommandError
        # llama.cpp's server words it so; litellm and others map that to a context error
        what = f"the request exceeds the available context size ({exc})" if over else str(exc)
        raise kind(f"llama.cpp refused the request: {what}; shorten the input or raise "
                   "n_ctx ([backends.llamacpp] or the model's n_ctx)", field=field) from None
