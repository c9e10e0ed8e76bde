"""Cancelling a grammar-constrained generation (the client gone, a shutdown) must not force an
end-of-sequence the grammar forbids: llama.cpp then aborts the whole process. And a grammar
that did abort a model's worker is refused afterwards rather than sent again."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from models_fixtures import smollm2_gguf

from edgepilot.backends.llamacpp.backend import LlamaCppBackend
from edgepilot.backends.llamacpp.grammar import schema_grammar
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.backends.llamacpp.process import WorkerCrashed
from edgepilot.backends.llamacpp.proxy import LlamaWorkerExecutable
from edgepilot.errors import GrammarAborted


def test_a_cancelled_constrained_generation_ends_without_touching_its_grammar() -> None:
    exe = LlamaCppBackend(LlamacppSection(n_ctx=256)).open(smollm2_gguf())
    try:
        cancel = threading.Event()
        ask = [{"role": "user", "content": "Describe Paris in JSON."}]
        going = exe.chat(ask, grammar=schema_grammar(None, "format"), max_tokens=8,
                         cancel=cancel, temperature=0)
        assert going["choices"][0]["message"]["content"].startswith("{")
        assert going["usage"]["completion_tokens"] == 8
        cancel.set()  # before the first token: ended by a stopping criterion, not an EOS
        # the grammar forbids there (that aborts llama.cpp), and not run to max_tokens either
        out = exe.chat(ask, grammar=schema_grammar(None, "format"), max_tokens=200,
                       cancel=cancel, temperature=0)
        assert out["usage"]["completion_tokens"] == 0, out["usage"]
        assert out["choices"][0]["finish_reason"] == "length"
        # the stream too, in a worker process (it would abort there)
        worker = LlamaCppBackend(LlamacppSection(n_ctx=256)).open_served(smollm2_gguf(),
                                                                         model="smol")
        try:
            chunks = list(worker.chat(ask, grammar=schema_grammar(None, "format"),
                                      max_tokens=200, cancel=cancel, stream=True))
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            assert text == "" and chunks[-1]["choices"][0]["finish_reason"] == "length"
        finally:
            worker.close()
        plain = exe.chat([{"role": "user", "content": "Describe Paris."}], max_tokens=8,
                         cancel=cancel)
        assert plain["usage"]["completion_tokens"] == 0  # cancelled: ends at once
    finally:
        exe.close()


# a long answer under its grammar: still generating when the worker is signalled
LONG = {"type": "object", "required": ["story"], "additionalProperties": False,
        "properties": {"story": {"type": "string", "minLength": 300}}}
STORY = [{"role": "user", "content": "Write a long story about a robot who learns to paint, "
                                     "as JSON."}]


def test_a_grammar_that_aborted_the_worker_is_refused_not_sent_again() -> None:
    """llama.cpp aborts the process on some grammar failures: the request gets a 503 naming
    SIGABRT, and the same grammar resent (clients retry a 503) is a 400 naming its field
    instead of a second crash; other grammars and plain requests go on."""
    backend = LlamaCppBackend(LlamacppSection(n_ctx=512))
    exe = backend.open_served(smollm2_gguf(), model="smol")
    assert isinstance(exe, LlamaWorkerExecutable)
    try:
        first = exe.worker_pid
        assert first is not None
        stream = iter(exe.chat(STORY, grammar=schema_grammar(LONG, "format"), max_tokens=400,
                               temperature=0, stream=True))
        next(stream)
        os.kill(first, signal.SIGABRT)  # what llama.cpp's GGML_ABORT does to its process
        with pytest.raises(WorkerCrashed, match=r"SIGABRT: llama.cpp aborted") as crashed:
            list(stream)
        assert crashed.value.http_status == 503
        for stream_it in (False, True):
            with pytest.raises(GrammarAborted) as refused:
                out = exe.chat(STORY, grammar=schema_grammar(LONG, "format"), max_tokens=4,
                               stream=stream_it)
                list(out) if stream_it else None
            assert refused.value.field == "format" and refused.value.http_status == 400
            assert "SIGABRT" in refused.value.message and "smol" in refused.value.message
        other = exe.chat(STORY, grammar=schema_grammar(None, "format"), max_tokens=4,
                         temperature=0)
        assert other["choices"][0]["message"]["content"].startswith("{")
        assert exe.restarts == 1 and exe.worker_pid not in (None, first)  # no second crash
    finally:
        exe.close()


def test_a_grammar_whose_worker_died_of_sigsegv_is_refused_too() -> None:
    """A grammar llama.cpp failed to parse, sampled with anyway, ends the worker in SIGSEGV,
    not SIGABRT; clients retried it into a crash each time. It is refused like an abort."""
    from edgepilot.backends.llamacpp.aborts import AbortedGrammars

    kept = AbortedGrammars("smol")
    params = {"grammar": schema_grammar(LONG, "response_format")}
    kept.died(params, -signal.SIGTERM, 41)  # stopped, not crashed: nothing kept
    kept.refuse(params)
    kept.died(params, -signal.SIGSEGV, 42)
    with pytest.raises(GrammarAborted) as refused:
        kept.refuse(params)
    assert refused.value.field == "response_format" and "SIGSEGV" in refused.value.message
    kept.refuse({"grammar": schema_grammar(None, "format")})  # another grammar goes on
