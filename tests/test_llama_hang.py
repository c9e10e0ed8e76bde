"""A hung llama.cpp worker is a dead worker: a worker that stops making decode steps with a
request in flight (here: stopped with SIGSTOP, so neither llama.cpp nor its heartbeat runs) is
killed once its deadline passes, its request fails with one error naming the hang, one
``backend.fault`` goes out, and the restarted worker serves the next request. Real
llama-cpp-python on SmolLM2-135M in a real worker process."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from models_fixtures import smollm2_gguf
from mqtt_fixtures import wait_for

from edgepilot.backends.llamacpp.backend import LlamaCppBackend, LlamaWorkerExecutable
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.backends.llamacpp.process import COLD_HANG_S, WorkerCrashed

STORY = [{"role": "user", "content": "Write a long story about a robot who learns to paint."}]
QUESTION = [{"role": "user", "content": "Which city is the capital of France?"}]


# the deadline is 50 x the slowest time per token seen: minutes on a loaded CI machine
@pytest.mark.timeout(900)
def test_a_stopped_worker_is_killed_as_hung_and_restarted() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    # a floor of seconds, not minutes: the test's hang is found fast, and a loaded machine's
    # slow steps before the SIGSTOP are not taken for one
    backend = LlamaCppBackend(LlamacppSection(n_ctx=1024, n_threads=1, hang_timeout_s=5))
    exe = backend.open_served(smollm2_gguf(), model="smol",
                              emit=lambda kind, **f: events.append((kind, f)))
    assert isinstance(exe, LlamaWorkerExecutable)
    try:
        # an idle worker is never hung, however long it waits; the story's prompt is read
        # here (a prompt chunk is a longer step than a token: the test's short floor is for
        # tokens), the stream below reads one token of it and then only generates
        assert exe.chat(QUESTION, max_tokens=4, temperature=0)["usage"]["completion_tokens"] == 4
        assert exe.chat(STORY, max_tokens=2, temperature=0)["usage"]["completion_tokens"] == 2
        first = exe.worker_pid
        assert first is not None
        # the worker's own step timings arm the deadline with its next heartbeat, even where
        # every request so far ended between two beats (before that it is the cold one)
        wait_for(lambda: (exe.hang_deadline_s or COLD_HANG_S) < COLD_HANG_S, timeout=30,
                 what="the watchdog armed by the worker's measured steps")
        stream = iter(exe.chat(STORY, max_tokens=400, temperature=0, stream=True))
        next(stream)
        os.kill(first, signal.SIGSTOP)
        with pytest.raises(WorkerCrashed, match=rf"pid {first}\) hung \(no decode step for "
                                                r"[0-9.]+ s with 1 request\(s\) in flight"):
            list(stream)
        out = exe.chat(QUESTION, max_tokens=4, temperature=0)  # from the restarted worker
        assert out["usage"]["completion_tokens"] == 4
        assert exe.worker_pid not in (None, first) and exe.restarts == 1
        faults = [f for k, f in events if k == "backend.fault"]
        assert len(faults) == 1 and "hung" in faults[0]["message"]
        assert faults[0]["pid"] == first and faults[0]["in_flight"] == 1
    finally:
        exe.close()
