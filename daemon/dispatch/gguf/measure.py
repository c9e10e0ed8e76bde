"""Timing GGUF candidates on llama.cpp without the daemon's own traffic in the measurement.

:func:`measure` loads a model once per ``n_gpu_layers`` and times a fixed reference request
(a prompt prefilled in one batch, then tokens decoded one at a time) for every thread count,
round by round, in alternating order, each round inside ``hold()`` (the daemon's device
queues), repeating noisy rounds up to a bound. :mod:`.plans` turns the measurements
into a plan.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from edgepilot.backends.llamacpp.backend import LLAMA_THREAD, LlamaCppBackend
from edgepilot.dispatch.gguf.live import NOISY_SPREAD
from edgepilot.dispatch.gguf.select import Measurement, spread
from edgepilot.errors import BackendError
from edgepilot.formats.gguf_info import GgufInfo

ROUNDS = 7
# noisy rounds are measured again, ROUNDS at a time, up to this many
MAX_ROUNDS = 21
# holds every device queue for one measuring round (a no-op outside a running daemon)
Hold = Callable[[], AbstractContextManager[Any]]



def reference_tokens(vocab: int, prompt_tokens: int, decode_tokens: int
                     ) -> tuple[list[int], list[int]]:
    """The reference request's token ids: a prompt and the tokens decoded after it (fixed,
    spread over the vocabulary; what they mean does not change what they cost)."""
    return ([(17 + 31 * i) % vocab for i in range(prompt_tokens)],
            [(5 + 7 * i) % vocab for i in range(decode_tokens)])


def time_request(llm: Any, prompt: list[int], nxt: list[int]) -> tuple[float, float]:
    """Prefill ``prompt`` in one batch from an empty context, then decode ``nxt`` one token
    at a time on a ``llama_cpp.Llama``: (prefill, decode) ms per token."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    for tok in nxt:
        llm.eval([tok])
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3 / len(prompt), (t2 - t1) * 1e3 / len(nxt)


def measure(backend: LlamaCppBackend, path: Path, info: GgufInfo, n_gpu_layers: int,
            threads: list[int], prompt_tokens: int, decode_tokens: int,
            rounds: int = ROUNDS, max_rounds: int = MAX_ROUNDS,
            hold: Hold = nullcontext) -> list[Measurement]:
    """Load ``path`` once with ``n_gpu_layers`` and time the reference request for every
    thread count; per-token medians over the rounds.

    Each round times every thread count, in alternating order, inside ``hold()`` (the daemon
    holds its device queues: no request runs meanwhile). After ``rounds`` rounds, if any
    count's decode times spread more than :data:`~.live.NOISY_SPREAD`, ``rounds`` more
    are taken, up to ``max_rounds``.
    """
    # a short context: speed at the start of a conversation, and little memory while measuring
    n_ctx = prompt_tokens + decode_tokens + 8
    try:
        # no draft model: the plan times the model's own decodes
        exe = backend.open(path, n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, info=info,
                           draft=False)
    except BackendError as exc:
        return [Measurement(t, n_gpu_layers, None, None, exc.message) for t in threads]
    try:
        llm = exe.llm
        prompt, nxt = reference_tokens(int(llm.n_vocab()), prompt_tokens, decode_tokens)
        prefill: dict[int, list[float]] = {t: [] for t in threads}
        decode: dict[int, list[float]] = {t: [] for t in threads}
        def one_round(order: list[int], counted: bool) -> None:
            # on the llama.cpp thread, like serving (see LlamaThread), inside the hold
            for t in order:
                exe.set_threads(t)
                pre, dec = time_request(llm, prompt, nxt)
                if counted:
                    prefill[t].append(pre)
                    decode[t].append(dec)

        target, r = rounds, 0
        while True:
            # alternate the order: the first count after the hold is taken must not always be
            # the same one (caches, frequency ramp-up); round 0 warms up and is not counted.
            # The hold is taken here, not on the llama.cpp thread: a request waiting for that
            # thread between two rounds must be able to run, or it would hold its device slot
            # while the next round waits for that slot.
            with hold():
                LLAMA_THREAD.call(one_round, threads if r % 2 == 0 else threads[::-1], r > 0)
            if r >= target:
                noisy = any(spread(decode[t]) > NOISY_SPREAD for t in threads)
                if not noisy or target >= max_rounds:
                    break
                target = min(target + rounds, max_rounds)
            r += 1
        return [Measurement(t, n_gpu_layers, statistics.median(prefill[t]),
                            statistics.median(decode[t]), rounds=len(decode[t]),
                            decode_spread=round(spread(decode[t]), 4)) for t in threads]
    finally:
        exe.close()
