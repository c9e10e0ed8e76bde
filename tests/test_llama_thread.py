"""Every llama.cpp computation runs on one thread, whoever calls (see ``LlamaThread``: a second
OpenMP master made multi-threaded decode 3x slower), and streams handed over from it behave
like streams iterated in place: same chunks, errors re-raised, early close stops the producer.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models_fixtures import gguf_path  # noqa: F401 - fixture

from edgepilot.backends.llamacpp.backend import LLAMA_THREAD, LlamaCppBackend
from edgepilot.config import LlamacppSection
from edgepilot.errors import CommandError

MESSAGES = [{"role": "user", "content": "hello the board"}]


def recorder(seen: set[int]) -> Any:
    def record(input_ids: Any, scores: Any) -> Any:  # called by llama.cpp's sampler per token
        seen.add(threading.get_ident())
        return scores
    return record


def test_chat_stream_and_tensor_run_compute_on_the_llama_thread(
        gguf_path: Path) -> None:  # noqa: F811
    exe = LlamaCppBackend(LlamacppSection(n_ctx=128)).open(gguf_path)
    llama_ident = LLAMA_THREAD.call(threading.get_ident)
    seen: set[int] = set()
    try:
        exe.chat(MESSAGES, max_tokens=4, temperature=0, logits_processor=[recorder(seen)])
        stream = exe.chat(MESSAGES, max_tokens=4, temperature=0, stream=True,
                          logits_processor=[recorder(seen)])
        in_place = list(stream)                              # consumed on this thread
        with ThreadPoolExecutor(2) as pool:                  # and on two other threads
            elsewhere = pool.submit(lambda: list(exe.chat(
                MESSAGES, max_tokens=4, temperature=0, stream=True,
                logits_processor=[recorder(seen)]))).result()
            logits = [pool.submit(exe.run, {"tokens": np.array([1, 5, 9])}).result()
                      for _ in range(2)]
        assert seen == {llama_ident}
        assert threading.get_ident() != llama_ident
        assert [c["choices"][0]["delta"] for c in in_place] == [
            c["choices"][0]["delta"] for c in elsewhere]
        assert stream.usage is not None and stream.usage["completion_tokens"] > 0
        np.testing.assert_array_equal(logits[0]["logits"], logits[1]["logits"])
    finally:
        exe.close()


def test_handed_over_stream_reraises_and_stops_early(gguf_path: Path) -> None:  # noqa: F811
    exe = LlamaCppBackend(LlamacppSection(n_ctx=64)).open(gguf_path)
    try:
        # llama.cpp refuses a prompt longer than the context: a 400 naming the field
        with pytest.raises(CommandError, match=r"llama\.cpp refused the request") as err:
            list(exe.chat([{"role": "user", "content": "hello " * 200}], max_tokens=4,
                          stream=True))
        assert err.value.field == "messages"
        # a consumer that leaves after one chunk: the model is free again at once
        it = iter(exe.chat(MESSAGES, max_tokens=32, temperature=0, stream=True))
        next(it)
        it.close()  # type: ignore[attr-defined]
        assert exe.lock.acquire(blocking=False)
        exe.lock.release()
        out = exe.chat(MESSAGES, max_tokens=2, temperature=0)
        assert out["choices"][0]["message"]["role"] == "assistant"
    finally:
        exe.close()
