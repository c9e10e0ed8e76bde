"""Draft-model speculative decoding (``[backends.llamacpp] speculative = "draft"``) on the real
SmolLM2 GGUF against the plain path of the same loaded model, and the vocabulary check.

Drafts: the same file drafting for itself (every greedy draft is the model's own choice: all
taken), and a random-weight GGUF written with SmolLM2's token table (its drafts are noise: the
request stops drafting). Both go through the verifier prompt lookup uses, so at temperature 0
with flash attention and 1 thread the tokens equal the plain path's.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from models_fixtures import gguf_path, make_daemon, smollm2_gguf  # noqa: F401 - fixtures
from speculative_prompts import COPY, FREE

import edgepilot.backends.llamacpp.draft_model as draft_model
import edgepilot.backends.llamacpp.speculative as speculative
from edgepilot.backends.llamacpp.backend import (
    LlamaCppBackend,
    LlamaExecutable,
    LlamaWorkerExecutable,
)
from edgepilot.backends.llamacpp.draft_model import DraftModel
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.errors import ModelError
from edgepilot.formats.gguf_gen import GgufSpec, write_gguf
from edgepilot.formats.gguf_info import read_gguf_info
from edgepilot.formats.gguf_vocab import check_same_vocab
from edgepilot.serving.registry import ModelTooLarge

FIELD = "backends.llamacpp.draft_model"


def settings(draft: Path) -> LlamacppSection:
    return LlamacppSection(n_ctx=1024, flash_attn=True, prefix_cache_entries=0,
                           speculative="draft", draft_model=draft)


def open_with(draft: Path) -> LlamaExecutable:
    exe = LlamaCppBackend(settings(draft)).open(smollm2_gguf())
    exe.set_threads(1)  # prompt, draft and batches alike: identity holds at 1 thread
    return exe


def answer(exe: LlamaExecutable, mode: str, messages: list[dict[str, str]],
           max_tokens: int = 48) -> tuple[str, dict[str, Any]]:
    exe.llm.speculative = mode
    out = exe.chat(messages, max_tokens=max_tokens, temperature=0)
    return out["choices"][0]["message"]["content"], out["usage"]


@pytest.fixture(scope="module")
def noise_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight llama GGUF with SmolLM2's token table: a draft of the right vocabulary
    whose guesses the real model rejects."""
    return write_gguf(tmp_path_factory.mktemp("draft") / "noise-smollm2-vocab.gguf",
                      GgufSpec(tokenizer_from=smollm2_gguf(), n_embd=64, n_ff=128))


@pytest.fixture(scope="module")
def self_drafted() -> Iterator[LlamaExecutable]:
    exe = open_with(smollm2_gguf())
    yield exe
    exe.close()


# ---- the vocabulary check ---------------------------------------------------------------------
def test_a_draft_of_the_same_token_table_passes_and_another_is_refused(
        noise_draft: Path, tmp_path: Path) -> None:
    assert check_same_vocab(smollm2_gguf(), noise_draft, field=FIELD) == 49152
    tiny = write_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(ModelError) as err:
        check_same_vocab(smollm2_gguf(), tiny, field=FIELD)
    assert err.value.field == FIELD
    assert err.value.message.startswith(FIELD) and "tokens against 49152" in err.value.message
    # same size, one token's text changed
    import gguf
    head = gguf.GGUFReader(str(noise_draft)).fields["tokenizer.ggml.tokens"].contents()
    changed = list(head)
    changed[100] = changed[100] + "x"
    w = gguf.GGUFWriter(str(tmp_path / "renamed.gguf"), "llama")
    w.add_token_list(changed)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError) as err:
        check_same_vocab(smollm2_gguf(), tmp_path / "renamed.gguf", field=FIELD)
    assert "token 100 is" in err.value.message


def test_a_draft_of_another_vocabulary_is_refused_at_load_and_the_model_serves(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tiny = write_gguf(tmp_path / "tiny.gguf")
    with caplog.at_level(logging.WARNING, logger="edgepilot.backends.llamacpp.backend"):
        exe = open_with(tiny)
    try:
        refusals = [r for r in caplog.records if "draft model refused" in r.getMessage()]
        assert len(refusals) == 1 and FIELD in refusals[0].getMessage()
        assert "\n" not in refusals[0].getMessage()
        assert exe.llm.draft_context is None and FIELD in exe.llm.draft_refused
        text, usage = answer(exe, "draft", FREE, 16)
        assert text and "completion_tokens_details" not in usage  # served, without drafting
    finally:
        exe.close()


def test_a_load_that_only_times_the_model_loads_no_draft() -> None:
    # the GGUF planner's measuring load (dispatch/gguf/measure.py)
    exe = LlamaCppBackend(settings(smollm2_gguf())).open(smollm2_gguf(), draft=False)
    try:
        assert exe.llm.draft_context is None and exe.llm.speculative == "off"
    finally:
        exe.close()


def test_a_missing_draft_file_is_refused_at_load(tmp_path: Path) -> None:
    exe = open_with(tmp_path / "absent.gguf")
    try:
        assert exe.llm.draft_context is None and "does not exist" in exe.llm.draft_refused
    finally:
        exe.close()


# ---- drafting on the real model ---------------------------------------------------------------
def test_the_model_drafting_for_itself_gives_the_plain_tokens_all_drafts_taken(
        self_drafted: LlamaExecutable, monkeypatch: pytest.MonkeyPatch) -> None:
    # the cost rules read the clock (a self-draft costs as much as the model): off here
    monkeypatch.setattr(speculative, "COST_AFTER", 1 << 30)
    monkeypatch.setattr(draft_model, "DRAFT_COST_MAX", float("inf"))
    for messages in (COPY, FREE):
        plain, plain_usage = answer(self_drafted, "off", messages)
        text, usage = answer(self_drafted, "draft", messages)
        assert text == plain and usage["completion_tokens"] == plain_usage["completion_tokens"]
        details = usage["completion_tokens_details"]
        drafter = self_drafted.llm.drafter
        assert isinstance(drafter, DraftModel) and drafter.off == ""
        assert details["rejected_prediction_tokens"] == 0
        assert details["accepted_prediction_tokens"] == drafter.drafted >= 20, details
    # the draft context holds what the model holds, no rejected tail
    held = self_drafted.llm.draft_context.held
    assert held == [int(t) for t in self_drafted.llm.input_ids[:len(held)]]


def test_a_draft_too_dear_to_pay_is_not_run_but_probed_now_and_then(
        self_drafted: LlamaExecutable) -> None:
    llm = self_drafted.llm
    context = llm.draft_context
    plain, _ = answer(self_drafted, "off", FREE, 24)
    # as timed: a draft decode at 10x the model's single-token decode
    llm.single_decode_s, context.decode_s = 0.001, 0.01
    context.requests = 0
    held = list(context.held)
    text, usage = answer(self_drafted, "draft", FREE, 24)
    assert text == plain and llm.drafter.off == "cost" and llm.drafter.drafted == 0
    assert usage["completion_tokens_details"] == {"accepted_prediction_tokens": 0,
                                                  "rejected_prediction_tokens": 0}
    assert context.held == held  # not even synced with the prompt
    # every PROBE_EVERY-th request drafts anyway, and times the draft again
    context.requests = draft_model.PROBE_EVERY - 1
    llm.single_decode_s, context.decode_s = 0.001, 0.01
    text, usage = answer(self_drafted, "draft", FREE, 24)
    assert text == plain and llm.drafter.drafted > 0 and context.decode_s != 0.01


def test_a_noise_draft_stops_drafting_with_the_plain_tokens(
        noise_draft: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(speculative, "COST_AFTER", 1 << 30)  # the acceptance rule alone
    monkeypatch.setattr(draft_model, "DRAFT_COST_MAX", float("inf"))
    exe = open_with(noise_draft)
    try:
        assert exe.llm.draft_context is not None, exe.llm.draft_refused
        plain, _ = answer(exe, "off", COPY)
        text, usage = answer(exe, "draft", COPY)
        assert text == plain
        drafter = exe.llm.drafter
        assert isinstance(drafter, DraftModel) and drafter.off == "acceptance"
        assert drafter.rounds == speculative.OFF_AFTER
        details = usage["completion_tokens_details"]
        assert details["rejected_prediction_tokens"] > details["accepted_prediction_tokens"]
        # the draft's KV lost the rejected drafts: what it holds is a prefix of the tokens
        held = exe.llm.draft_context.held
        assert held == [int(t) for t in exe.llm.input_ids[:len(held)]]
    finally:
        exe.close()


def test_a_worker_process_drafts_with_the_draft_model(self_drafted: LlamaExecutable) -> None:
    backend = LlamaCppBackend(settings(Path(smollm2_gguf().name)))  # relative: the model's dir
    worker = backend.open_served(smollm2_gguf(), model="smol", n_threads=1)
    assert isinstance(worker, LlamaWorkerExecutable)
    try:
        out = worker.chat(COPY, max_tokens=48, temperature=0)
    finally:
        worker.close()
    text, _ = answer(self_drafted, "draft", COPY)
    assert out["choices"][0]["message"]["content"] == text
    assert out["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0


def test_the_memory_estimate_counts_the_draft(tmp_path: Path, gguf_path: Path) -> None:  # noqa: F811
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(gguf_path, models / "tiny.gguf")
    shutil.copy(gguf_path, models / "draft.gguf")
    llama = {"flash_attn": True, "speculative": "draft", "draft_model": "draft.gguf"}
    d = make_daemon(tmp_path, backends={"memory_budget_mb": 8, "llamacpp": llama},
                    models=[{"name": "tiny", "file": "tiny.gguf", "n_ctx": 4096}])
    with pytest.raises(ModelTooLarge) as err:
        asyncio.run(d.models.load("tiny"))
    alone = read_gguf_info(models / "tiny.gguf").estimate_bytes(4096)
    assert "+ draft model draft.gguf" in err.value.message
    assert f"needs ~{2 * alone / (1 << 20):.1f} MiB" in err.value.message, err.value.message
