"""Cancelling a grammar-constrained generation (the client gone, a shutdown) must not force an
end-of-sequence the grammar forbids: llama.cpp then aborts the whole process."""

from __future__ import annotations

import threading

from models_fixtures import smollm2_gguf

from edgepilot.backends.llamacpp.backend import LlamaCppBackend
from edgepilot.backends.llamacpp.grammar import schema_grammar
from edgepilot.backends.llamacpp.options import LlamacppSection


def test_a_cancelled_constrained_generation_ends_under_its_grammar() -> None:
    exe = LlamaCppBackend(LlamacppSection(n_ctx=256)).open(smollm2_gguf())
    try:
        cancel = threading.Event()
        cancel.set()  # before the first token: an unconstrained one would end at once
        out = exe.chat([{"role": "user", "content": "Describe Paris in JSON."}],
                       grammar=schema_grammar(None, "format"), max_tokens=8, cancel=cancel)
        text = out["choices"][0]["message"]["content"]
        assert text.startswith("{") and out["choices"][0]["finish_reason"] == "length"
        plain = exe.chat([{"role": "user", "content": "Describe Paris."}], max_tokens=8,
                         cancel=cancel)
        assert plain["usage"]["completion_tokens"] == 0  # cancelled: ends at once
    finally:
        exe.close()
