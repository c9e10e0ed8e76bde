"""Prompt lookup decoding (``[backends.llamacpp] speculative = "prompt_lookup"``): the drafter
on its own, then on the real SmolLM2 GGUF against the plain path of the same loaded model.

What is asserted on the real model is what held when it was measured (bench/README.md): with
flash attention and 1 thread (a batch row then rounds like a single decode) a copy prompt gives
the plain path's tokens at temperature 0 with drafts taken; a free-form prompt
whose drafts are rejected stops drafting, visibly in its usage counts. Free-form tokens can
differ from the plain path (a batched decode rounds differently at near ties), so they are not
compared.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from models_fixtures import smollm2_gguf
from speculative_prompts import COPY, FREE

import edgepilot.backends.llamacpp.speculative as speculative_module
from edgepilot.backends.llamacpp.backend import (
    LlamaCppBackend,
    LlamaExecutable,
    LlamaWorkerExecutable,
)
from edgepilot.backends.llamacpp.lookup import K_START, PromptLookup, find_draft
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.backends.llamacpp.speculative import COST_AFTER, OFF_AFTER


# ---- the drafter ------------------------------------------------------------------------------
def test_the_draft_follows_the_most_recent_earlier_match() -> None:
    ids = np.array([5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 4, 1, 2, 3])
    # [1, 2, 3] ends the tokens and occurred at 1 and 6: the later one goes on 7, 8, 4, ...
    assert find_draft(ids, 2).tolist() == [7, 8]
    assert find_draft(ids, 10).tolist() == [7, 8, 4, 1, 2, 3]
    # a repeated bigram is not enough by default
    assert find_draft(np.array([1, 2, 5, 6, 1, 2]), 4).tolist() == []
    assert find_draft(np.array([1, 2, 5, 6, 1, 2]), 4, min_ngram=2).tolist() == [5, 6, 1, 2]
    assert find_draft(np.array([4]), 4).tolist() == []


def test_drafting_stops_for_the_request_when_its_drafts_are_rejected() -> None:
    lookup = PromptLookup()
    ids = np.arange(12) % 9  # 0..8, 0, 1, 2: "0 1 2" continues 3, 4, ...
    for _ in range(OFF_AFTER):
        assert len(lookup(ids)) > 0
        lookup.checked(False)
    assert len(lookup(ids)) == 0 and lookup.off == "acceptance"
    assert lookup.accepted == 0 and lookup.rejected == lookup.drafted > 0


def test_drafting_stops_when_its_batches_cost_more_than_single_decodes() -> None:
    lookup = PromptLookup(single_s=0.01)
    ids = np.arange(40) % 30
    for _ in range(COST_AFTER):
        drafts = lookup(ids)
        assert len(drafts) > 0
        for _ in drafts:
            lookup.checked(True)
        lookup.batch_s += 1.0  # every draft taken, but each batch took 100 single decodes
    assert len(lookup(ids)) == 0 and lookup.off == "cost"
    assert lookup.k > K_START  # k grew while every draft was taken


# ---- on the real model ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol() -> Iterator[LlamaExecutable]:
    exe = LlamaCppBackend(LlamacppSection(n_ctx=1024, flash_attn=True, speculative="prompt_lookup",
                                          prefix_cache_entries=0)).open(smollm2_gguf())
    exe.set_threads(1)  # prompt and draft batches too: a shared test machine's cores are busy
    yield exe
    exe.close()


def answer(exe: LlamaExecutable, mode: str, messages: list[dict[str, str]],
           max_tokens: int = 48, **params: Any) -> tuple[str, dict[str, Any]]:
    exe.llm.speculative = mode
    out = exe.chat(messages, max_tokens=max_tokens, **{"temperature": 0, **params})
    return out["choices"][0]["message"]["content"], out["usage"]


def test_a_copy_prompt_gives_the_plain_tokens_with_drafts_taken(
        smol: LlamaExecutable, monkeypatch: pytest.MonkeyPatch) -> None:
    # the cost rule reads the clock (a loaded machine can make batches look dear): off here,
    # so the counts compared below do not depend on timing
    monkeypatch.setattr(speculative_module, "COST_AFTER", 1 << 30)
    plain, plain_usage = answer(smol, "off", COPY)
    text, usage = answer(smol, "prompt_lookup", COPY)
    assert text == plain and usage["completion_tokens"] == plain_usage["completion_tokens"]
    assert "completion_tokens_details" not in plain_usage
    details = usage["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] >= 10, details
    assert smol.llm.drafter.off == ""
    # streamed: the same tokens, the same counts in the stream's usage
    smol.llm.speculative = "prompt_lookup"
    stream = smol.chat(COPY, max_tokens=48, temperature=0, stream=True)
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in stream)
    assert streamed == plain
    assert stream.usage is not None and stream.usage["completion_tokens_details"] == details


def test_a_free_form_prompt_stops_drafting(smol: LlamaExecutable,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(speculative_module, "COST_AFTER", 1 << 30)  # the acceptance rule alone
    _, usage = answer(smol, "prompt_lookup", FREE)
    details = usage["completion_tokens_details"]
    assert smol.llm.drafter.off == "acceptance"
    assert details["rejected_prediction_tokens"] > details["accepted_prediction_tokens"]
    # only the rounds before the judgement drafted: far fewer drafts than tokens answered
    assert smol.llm.drafter.rounds == OFF_AFTER
    assert details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"] < \
        usage["completion_tokens"]


def test_only_greedy_requests_draft(smol: LlamaExecutable) -> None:
    _, usage = answer(smol, "prompt_lookup", COPY, 12, temperature=0.7, seed=1)
    assert "completion_tokens_details" not in usage and smol.llm.drafter is None
    _, usage = answer(smol, "prompt_lookup", COPY, 12, logprobs_top=2)
    assert "completion_tokens_details" not in usage


def test_a_worker_process_drafts_as_in_process(smol: LlamaExecutable) -> None:
    # the setting travels to the worker with the rest of [backends.llamacpp], and the counts
    # come back in usage
    backend = LlamaCppBackend(LlamacppSection(n_ctx=1024, flash_attn=True, prefix_cache_entries=0,
                                              speculative="prompt_lookup"))
    worker = backend.open_served(smollm2_gguf(), model="smol", n_threads=1)
    assert isinstance(worker, LlamaWorkerExecutable)
    try:
        out = worker.chat(COPY, max_tokens=48, temperature=0)
    finally:
        worker.close()
    text, usage = answer(smol, "prompt_lookup", COPY)
    assert out["choices"][0]["message"]["content"] == text
    # the counts themselves may differ: the worker's cost rule reads its own clock
    assert out["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
    assert "completion_tokens_details" in usage
