"""The ``openai`` package against a real daemon subprocess serving a generated GGUF."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import ollama
import openai
import pytest
from daemon_proc import DaemonProcess
from llama_cpp import Llama
from models_fixtures import gguf_path, module_tmp, start_daemon  # noqa: F401 - fixtures

from edgepilot.formats.onnx_gen import mlp_stack

MESSAGES = [{"role": "system", "content": "You are an edge board."},
            {"role": "user", "content": "hello the board"}]


@pytest.fixture(scope="module")
def daemon(module_tmp: Path, gguf_path: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    shutil.copy(gguf_path, models / "tiny.gguf")
    mlp_stack(models / "mlp.onnx", widths=(8, 8), batch=1)
    d = start_daemon(module_tmp, "[backends.llamacpp]\nn_ctx = 256\n"
                                 '[[models]]\nname = "tiny"\nfile = "tiny.gguf"\n')
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(gguf_path: Path) -> Iterator[Llama]:  # noqa: F811
    llm = Llama(str(gguf_path), n_ctx=256, seed=0, verbose=False)
    yield llm
    llm.close()


def test_models_are_listed(client: openai.OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert ids == {"tiny", "mlp"}


def test_chat_completion_usage_matches_llamacpp(client: openai.OpenAI, reference: Llama) -> None:
    got = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                         max_tokens=12, temperature=0)
    want = reference.create_chat_completion(messages=MESSAGES, max_tokens=12,  # type: ignore[arg-type]
                                            temperature=0)
    assert got.model == "tiny"
    assert got.choices[0].message.content == want["choices"][0]["message"]["content"]
    assert got.usage is not None
    assert got.usage.prompt_tokens == want["usage"]["prompt_tokens"]
    assert got.usage.completion_tokens == want["usage"]["completion_tokens"]
    assert got.usage.total_tokens == want["usage"]["total_tokens"]


def test_streamed_chat_equals_the_plain_one(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                           max_tokens=10, temperature=0)
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                            max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert text == plain.choices[0].message.content
    assert finish == plain.choices[0].finish_reason
    assert usage is not None and plain.usage is not None
    assert usage.prompt_tokens == plain.usage.prompt_tokens
    assert usage.completion_tokens == plain.usage.completion_tokens


def test_stop_strings_usage_streamed_and_plain_equal_llamacpp(client: openai.OpenAI,
                                                               reference: Llama) -> None:
    full = reference.create_chat_completion(messages=MESSAGES, max_tokens=24,  # type: ignore[arg-type]
                                            temperature=0)
    content = full["choices"][0]["message"]["content"]  # type: ignore[index]
    checked = 0
    for i in range(0, len(content) - 2, 2):
        stop = content[i:i + 2]
        want = reference.create_chat_completion(messages=MESSAGES, max_tokens=24,  # type: ignore[arg-type]
                                                temperature=0, stop=[stop])
        if want["choices"][0]["finish_reason"] != "stop":  # type: ignore[index]
            continue  # llama-cpp-python did not match this one on its own detokenization
        plain = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                               max_tokens=24, temperature=0, stop=[stop])
        stream = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                                max_tokens=24, temperature=0, stop=[stop],
                                                stream=True,
                                                stream_options={"include_usage": True})
        usage = [c.usage for c in stream if c.usage is not None]
        assert plain.choices[0].finish_reason == "stop"
        assert plain.usage is not None and len(usage) == 1
        wanted = want["usage"]  # type: ignore[index]
        assert plain.usage.completion_tokens == wanted["completion_tokens"], stop
        assert usage[0].completion_tokens == wanted["completion_tokens"], stop
        assert usage[0].prompt_tokens == wanted["prompt_tokens"]
        checked += 1
        if checked == 2:
            break
    assert checked == 2, content


def test_raw_stream_ends_with_done(daemon: DaemonProcess) -> None:
    body = json.dumps({"model": "tiny", "messages": MESSAGES, "max_tokens": 3,
                       "stream": True}).encode()
    req = urllib.request.Request(daemon.url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.read().decode().splitlines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)


def test_text_completion(client: openai.OpenAI, reference: Llama) -> None:
    got = client.completions.create(model="tiny", prompt="the edge board is", max_tokens=6,
                                    temperature=0)
    want = reference.create_completion(prompt="the edge board is", max_tokens=6, temperature=0)
    assert got.choices[0].text == want["choices"][0]["text"]  # type: ignore[index]
    assert got.usage is not None
    assert got.usage.prompt_tokens == want["usage"]["prompt_tokens"]  # type: ignore[index]


def test_several_prompts_and_answers_in_one_request(client: openai.OpenAI,
                                                    reference: Llama) -> None:
    # LangChain's OpenAI LLM sends its prompts in one request; n asks for several answers
    prompts = ["the edge board is", "hello the"]
    got = client.completions.create(model="tiny", prompt=prompts, max_tokens=4, temperature=0,
                                    n=2)
    assert [c.index for c in got.choices] == [0, 1, 2, 3]
    want = [reference.create_completion(prompt=p, max_tokens=4, temperature=0) for p in prompts]
    assert [c.text for c in got.choices] == [w["choices"][0]["text"]  # type: ignore[index]
                                             for w in want for _ in range(2)]
    assert got.usage is not None
    assert got.usage.prompt_tokens == 2 * sum(w["usage"]["prompt_tokens"]  # type: ignore[index]
                                              for w in want)
    assert got.usage.completion_tokens == 2 * sum(
        w["usage"]["completion_tokens"] for w in want)  # type: ignore[index]
    streamed = list(client.completions.create(
        model="tiny", prompt=prompts, max_tokens=4, temperature=0, n=2, stream=True,
        stream_options={"include_usage": True}))
    texts = ["", "", "", ""]
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in got.choices]
    assert streamed[-1].usage is not None and streamed[-1].usage.total_tokens == \
        got.usage.total_tokens
    # sampled with a seed, the answers are not one answer repeated: each has its own seed
    seeded = client.completions.create(model="tiny", prompt="the", max_tokens=12, seed=7,
                                       temperature=1.0, n=3)
    assert len({c.text for c in seeded.choices}) > 1
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                          max_tokens=4, temperature=0, n=2)
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content
    # top_p 0 (some clients' "deterministic") keeps the most likely token: greedy
    assert client.completions.create(model="tiny", prompt=prompts[0], max_tokens=4,
                                     top_p=0).choices[0].text == got.choices[0].text


def test_bad_requests_get_openai_errors_and_serving_goes_on(client: openai.OpenAI,
                                                            daemon: DaemonProcess) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="ghost", messages=MESSAGES)  # type: ignore[arg-type]
    assert "unknown model 'ghost'" in str(nf.value) and "tiny" in str(nf.value)
    with pytest.raises(openai.BadRequestError, match="/v1/infer/mlp"):
        client.chat.completions.create(model="mlp", messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                       temperature=5)
    code, body = daemon.request("POST", "/v1/chat/completions",
                                {"model": "tiny", "messages": MESSAGES, "bogus": 1})
    assert code == 400 and body["error"]["param"] == "bogus"
    assert body["error"]["type"] == "invalid_request_error"
    ok = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                        max_tokens=2, temperature=0)
    assert ok.choices[0].message.role == "assistant"


def test_client_leaving_mid_stream_frees_the_device(daemon: DaemonProcess,
                                                    client: openai.OpenAI) -> None:
    body = json.dumps({"model": "tiny", "messages": MESSAGES, "max_tokens": 200,
                       "temperature": 0, "stream": True}).encode()
    req = urllib.request.Request(daemon.url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.readline().startswith(b"data: ")  # then hang up mid-stream
    ok = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                        max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in ("length", "stop")
    code, listing = daemon.request("POST", "/v1/commands/model.list", {})
    assert code == 200 and listing["result"]["models"]


def test_prompt_longer_than_the_context_is_a_400_naming_the_field(
        daemon: DaemonProcess, client: openai.OpenAI) -> None:
    long = "edge " * 600  # > n_ctx = 256 tokens
    code, body = daemon.request("POST", "/v1/completions",
                                {"model": "tiny", "prompt": long, "max_tokens": 2})
    assert code == 400, body
    assert body["error"]["param"] == "prompt" and "context window" in body["error"]["message"]
    code, body = daemon.request("POST", "/v1/chat/completions",
                                {"model": "tiny", "max_tokens": 2,
                                 "messages": [{"role": "user", "content": long}]})
    assert code == 400 and body["error"]["param"] == "messages", body
    # streamed too: the refusal comes before the first token, so it is a 400, not a 200 with
    # an error event
    code, body = daemon.request("POST", "/v1/completions",
                                {"model": "tiny", "prompt": long, "max_tokens": 2,
                                 "stream": True})
    assert code == 400 and body["error"]["param"] == "prompt", body
    code, body = daemon.request("POST", "/v1/chat/completions",
                                {"model": "tiny", "max_tokens": 2, "stream": True,
                                 "messages": [{"role": "user", "content": long}]})
    assert code == 400 and body["error"]["param"] == "messages", body
    # OpenAI's code for it, which clients act on (litellm's ContextWindowExceededError)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", max_tokens=2,
                                       messages=[{"role": "user", "content": long}])
    assert refused.value.code == "context_length_exceeded", refused.value.body
    # and llama.cpp's server's words, which litellm (1.110) matches on, not the code
    assert "exceeds the available context size" in str(refused.value).lower()
    ok = client.completions.create(model="tiny", prompt="edge", max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_lone_surrogate_text_is_refused_with_its_field(daemon: DaemonProcess) -> None:
    code, body = daemon.request("POST", "/v1/chat/completions",
                                {"model": "tiny", "max_tokens": 2,
                                 "messages": [{"role": "user", "content": "hi \ud800"}]})
    assert code == 400, body
    assert body["error"]["param"].startswith("messages.0.content"), body
    assert "surrogate" in body["error"]["message"]
    code, body = daemon.request("POST", "/v1/completions",
                                {"model": "tiny", "max_tokens": 2, "prompt": "\udfff"})
    assert code == 400 and body["error"]["param"].startswith("prompt"), body


def test_malformed_json_body_names_the_body(daemon: DaemonProcess) -> None:
    code, body = daemon.request("POST", "/v1/chat/completions", b'{"model": "tiny", bad')
    assert code == 400, body
    assert body["error"]["param"] == "body" and "not valid JSON" in body["error"]["message"]


TOOL = {"type": "function", "function": {"name": "light", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "light", "arguments": "{}"}}
# (route, body, the field the 400 names): checked before any generation, so cheap
BAD = [
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, "messages.0.role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages.0.content"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [CALL]},
        {"role": "tool", "content": "ok"}]}, "messages.2.tool_call_id"),
    ("/v1/chat/completions", {"messages": [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "call_9", "content": "ok"}]}, "messages.1.tool_call_id"),
    ("/v1/chat/completions", {"messages": MESSAGES, "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "heater"}}}, "tool_choice.function.name"),
    ("/v1/chat/completions", {"messages": MESSAGES, "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"messages": MESSAGES, "tools": [{"type": "function", "function": {
        "name": "x", "parameters": {"type": "objekt"}}}]}, "tools.0.function.parameters"),
    ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": {"required": "x"}}}},
     "response_format.json_schema.schema"),
    ("/v1/completions", {"prompt": {"text": "hi"}}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 99}, "logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": [True]}, "logprobs"),
    ("/v1/embeddings", {"input": [1, 2]}, "input"),
    ("/v1/embeddings", {"input": [[9906, 1917]]}, "input"),
    ("/v1/embeddings", {}, "input"),
    ("/v1/completions", {"prompt": [9906, 1917]}, "prompt"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "n": 33}, "n"),
    ("/v1/completions", {"prompt": ["a"] * 9, "n": 4}, "prompt"),
    ("/v1/chat/completions", {"messages": MESSAGES, "tools": [TOOL], "n": 2}, "n"),
    ("/v1/chat/completions", {"messages": MESSAGES, "logit_bias": {"50256": -100}},
     "logit_bias"),
    ("/v1/chat/completions", {"messages": MESSAGES, "modalities": ["text", "audio"]},
     "modalities.1"),
]


@pytest.mark.parametrize(("path", "body", "field"), BAD)
def test_malformed_openai_requests_are_400_naming_the_field(
        daemon: DaemonProcess, client: openai.OpenAI, path: str, body: dict[str, object],
        field: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.post(path[3:], body={"model": "tiny", "max_tokens": 2, **body},
                    cast_to=object)
    assert err.value.status_code == 400
    error = err.value.body
    assert isinstance(error, dict) and error["code"] == "bad_request", error
    assert error["param"] == field and error["field"] == field, error
    assert error["type"] == "invalid_request_error" and error["message"], error


OLLAMA_BAD = [
    ("/api/chat", {"messages": [{"content": "hi"}]}, "messages.0.role"),
    ("/api/chat", {"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ("/api/chat", {"messages": [{"role": "user", "content": ["hi"]}]}, "messages.0.content"),
    ("/api/chat", {"messages": MESSAGES, "format": {"type": "objekt"}}, "format"),
    ("/api/chat", {"messages": MESSAGES, "tools": [{"type": "function", "function": {
        "name": "x", "parameters": {"type": "objekt"}}}]}, "tools.0.function.parameters"),
    ("/api/generate", {"prompt": 5}, "prompt"),
    ("/api/generate", {"prompt": "hi", "options": {"top_k": "many"}}, "options.top_k"),
    ("/api/embed", {"input": [1]}, "input"),
    ("/api/embeddings", {"prompt": ["a"]}, "prompt"),
]


@pytest.mark.parametrize(("path", "body", "field"), OLLAMA_BAD)
def test_malformed_ollama_requests_are_400_with_a_string_error_naming_the_field(
        daemon: DaemonProcess, path: str, body: dict[str, object], field: str) -> None:
    client = ollama.Client(host=daemon.url)
    with pytest.raises(ollama.ResponseError) as err:
        client._request_raw("POST", path, json={"model": "tiny", "stream": False, **body})
    assert err.value.status_code == 400
    assert isinstance(err.value.error, str) and field in err.value.error, err.value.error
    # the client's own calls raise the same (here: a role Ollama does not know)
    with pytest.raises(ollama.ResponseError) as chat:
        client.chat(model="tiny", messages=[{"role": "robot", "content": "hi"}])
    assert chat.value.status_code == 400 and "messages.0.role" in chat.value.error


def test_logprobs_of_chat_and_completions(client: openai.OpenAI, gguf_path: Path) -> None:  # noqa: F811
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                          max_tokens=8, temperature=0, logprobs=True,
                                          top_logprobs=3)
    text = chat.choices[0].message.content or ""
    assert chat.choices[0].logprobs is not None
    content = chat.choices[0].logprobs.content or []
    assert text and content
    assert "".join(t.token for t in content) == text
    assert all(t.bytes for t in content)  # each token's own bytes (some are no UTF-8 alone)
    for t in content:
        tops = [a.logprob for a in t.top_logprobs]
        assert t.logprob <= 0 and len(tops) == 3 and tops == sorted(tops, reverse=True)
        # greedy, no penalties: the token chosen is the model's most likely one
        assert t.logprob == pytest.approx(tops[0], abs=1e-5)
    got = client.completions.create(model="tiny", prompt="the edge board is", max_tokens=6,
                                    temperature=0, logprobs=2)
    lp = got.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert "".join(lp.tokens) == got.choices[0].text
    # the raw runtime, keeping every position's logits, gives the same numbers
    ref = Llama(str(gguf_path), n_ctx=256, logits_all=True, verbose=False)
    try:
        want = ref.create_completion(prompt="the edge board is", max_tokens=6, temperature=0,
                                     logprobs=2)["choices"][0]["logprobs"]  # type: ignore[index]
    finally:
        ref.close()
    np.testing.assert_allclose(lp.token_logprobs, want["token_logprobs"], atol=1e-3)
    for mine, theirs in zip(lp.top_logprobs, want["top_logprobs"], strict=True):
        # keyed by the token's text: distinct tokens of one text share a key
        assert 1 <= len(mine) <= 2 and all(v <= 0 for v in mine.values())
        np.testing.assert_allclose(max(mine.values()), max(theirs.values()), atol=1e-3)


def test_streamed_logprobs_equal_the_whole_answers(client: openai.OpenAI) -> None:
    ask = {"model": "tiny", "max_tokens": 12, "temperature": 0, "stop": ["\n\n"]}
    whole = client.chat.completions.create(messages=MESSAGES, logprobs=True,  # type: ignore[arg-type, call-overload]
                                           top_logprobs=2, **ask)
    want = whole.choices[0].logprobs
    assert want is not None and want.content
    chunks = list(client.chat.completions.create(messages=MESSAGES, logprobs=True,  # type: ignore[arg-type, call-overload]
                                                 top_logprobs=2, stream=True, **ask))
    got = [t for c in chunks if c.choices and c.choices[0].logprobs
           for t in c.choices[0].logprobs.content or []]
    assert [(t.token, t.bytes) for t in got] == [(t.token, t.bytes) for t in want.content]
    np.testing.assert_allclose([t.logprob for t in got], [t.logprob for t in want.content],
                               atol=1e-5)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content == "".join(t.token for t in got)
    pieces = list(client.completions.create(prompt="the edge board is", logprobs=1,  # type: ignore[call-overload]
                                            stream=True, **ask))
    tokens = [t for p in pieces if p.choices and p.choices[0].logprobs
              for t in p.choices[0].logprobs.tokens or []]
    assert "".join(tokens) == "".join(p.choices[0].text for p in pieces if p.choices)


def test_an_answer_past_the_context_ends_with_length_not_an_error(
        client: openai.OpenAI, daemon: DaemonProcess) -> None:
    """A prompt that fits the context (256 tokens) but leaves less room than ``max_tokens``
    asks: the answer is the tokens that fit, ending ``length`` (OpenAI) / ``done_reason:
    "length"`` (Ollama), streamed or not, on both APIs."""
    room = 256 - 200  # the prompt below is 200 tokens and max_tokens 500 (> the context)
    prompt = "a " * 198  # the tiny GGUF's tokenizer: BOS, then one token a word, one more
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=500,
                                      temperature=0)
    assert whole.usage is not None and whole.usage.prompt_tokens == 200, whole.usage
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == room
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=500,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == room
    messages = [{"role": "user", "content": prompt}]
    chat = client.chat.completions.create(model="tiny", messages=messages,  # type: ignore[arg-type]
                                          max_tokens=500, temperature=0)
    assert chat.usage is not None and chat.choices[0].finish_reason == "length"
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == 256
    streamed = list(client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=500,  # type: ignore[arg-type]
        temperature=0, stream=True))
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "length"
    ol = ollama.Client(host=daemon.url)
    for stream in (False, True):
        got = ol.chat(model="tiny", messages=messages, stream=stream,
                      options={"num_predict": 500, "temperature": 0})
        last = list(got)[-1] if stream else got
        assert isinstance(last, ollama.ChatResponse)
        assert last.done and last.done_reason == "length"
        assert last.eval_count == chat.usage.completion_tokens
        gen = ol.generate(model="tiny", prompt=prompt, raw=True, stream=stream,
                          options={"num_predict": -1, "temperature": 0})
        end = list(gen)[-1] if stream else gen
        assert isinstance(end, ollama.GenerateResponse)
        assert end.done and end.done_reason == "length" and end.eval_count == room


def test_fields_clients_forward_are_accepted_and_nulls_are_defaults(
        client: openai.OpenAI) -> None:
    """LangChain, litellm and the SDK forward what their users set: OpenAI's fields that
    change nothing a local model generates are accepted (and ignored); null is the default."""
    got = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=2, temperature=None,  # type: ignore[arg-type]
        top_p=None, presence_penalty=None, n=None, store=False, metadata={"run": "7"},
        service_tier="auto", prompt_cache_key="k", safety_identifier="u1",
        reasoning_effort="low", verbosity="low", modalities=["text"], logit_bias={},
        user="board-7")
    assert got.choices[0].message.role == "assistant"
    assert client.completions.create(model="tiny", prompt=["the board"], max_tokens=2,
                                     logit_bias={}).choices[0].text is not None


def test_logit_bias_steers_the_tokens_and_keeps_the_daemons_processors(
        client: openai.OpenAI, reference: Llama) -> None:
    """+100 makes a token the only choice. llama-cpp-python's own logit_bias
    replaced the daemon's logits processors with None (the logprob recorder, the cancel
    check): here logprobs still come back, naming the biased token."""
    tok = reference.tokenize(b" board", add_bos=False)[0]
    piece = reference.detokenize([tok]).decode()
    got = client.completions.create(model="tiny", prompt="the", max_tokens=4, temperature=0,
                                    logit_bias={str(tok): 100}, logprobs=1)
    assert got.choices[0].text == piece * 4
    assert got.choices[0].logprobs is not None
    assert got.choices[0].logprobs.tokens == [piece] * 4
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                       logit_bias={str(reference.n_vocab()): 5})
    assert "logit_bias" in str(err.value) and f"[0, {reference.n_vocab()})" in str(err.value)


def test_one_model_by_id_and_an_unknown_one(client: openai.OpenAI) -> None:
    model = client.models.retrieve("tiny")
    assert model.id == "tiny" and model.object == "model"
    with pytest.raises(openai.NotFoundError, match=r"'ghost' is not served here.*tiny"):
        client.models.retrieve("ghost")


def test_token_ids_are_refused_in_one_line_naming_the_way_out(client: openai.OpenAI) -> None:
    """Token ids are OpenAI's (tiktoken) when LangChain's OpenAIEmbeddings sends them: embedding
    them as this model's would answer silently wrong."""
    with pytest.raises(openai.BadRequestError, match="check_embedding_ctx_length=False"):
        client.embeddings.create(model="tiny", input=[[9906, 1917]])


def test_no_token_limit_means_until_the_context_is_full_not_16_tokens(
        client: openai.OpenAI, reference: Llama) -> None:
    # llama-cpp-python's own default (16 tokens) cut every answer of a client that sends no
    # limit (LangChain, litellm): OpenAI's is end-of-sequence or a full context (256 here)
    tok = reference.tokenize(b" board", add_bos=False)[0]
    got = client.completions.create(model="tiny", prompt="the", temperature=0,
                                    logit_bias={str(tok): 100})
    assert got.usage is not None and got.choices[0].finish_reason == "length"
    assert got.usage.prompt_tokens + got.usage.completion_tokens == 256


def test_a_generation_whose_bytes_stop_being_utf8_ends_instead_of_crawling(
        client: openai.OpenAI, reference: Llama) -> None:
    # llama-cpp-python holds back every token after a byte no further byte makes UTF-8 and
    # retries all of them at each token: a request without a limit ran 20 minutes
    from edgepilot.backends.llamacpp.ending import HOLD_LIMIT

    bad = next(i for i in range(reference.n_vocab()) if reference.detokenize([i]) == b"\xbe")
    got = client.completions.create(model="tiny", prompt="the", temperature=0, max_tokens=200,
                                    logit_bias={str(bad): 100})
    assert got.usage is not None and got.choices[0].finish_reason == "stop"
    assert HOLD_LIMIT <= got.usage.completion_tokens <= HOLD_LIMIT + 2, got.usage


def test_an_answers_message_sent_back_whole_is_taken(client: openai.OpenAI) -> None:
    # agent loops append ``message.model_dump()``: refusal, audio, function_call as null and
    # annotations as [] are OpenAI's own answer fields
    first = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                           max_tokens=4, temperature=0)
    echoed = {**first.choices[0].message.model_dump(), "annotations": []}
    assert {"refusal", "audio", "function_call"} <= set(echoed)
    again = client.chat.completions.create(
        model="tiny", messages=[*MESSAGES, echoed, {"role": "user", "content": "and?"}],  # type: ignore[list-item]
        max_tokens=4, temperature=0, stream_options=None)
    assert again.choices[0].message.role == "assistant"
    streamed = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=4, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True, "include_obfuscation": False})
    assert [c for c in streamed if c.usage is not None]


def test_llamacpp_samplers_reach_the_sampler_and_image_parts_are_named(
        client: openai.OpenAI) -> None:
    # top_k etc. are llama.cpp's server's, not OpenAI's: local front ends send them
    greedy = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                            max_tokens=8, temperature=0)
    top1 = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                          max_tokens=8, temperature=1.5, seed=7,
                                          extra_body={"top_k": 1, "min_p": 0.0,
                                                      "repeat_penalty": 1.0})
    assert top1.choices[0].message.content == greedy.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="top_k"):
        client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                       extra_body={"top_k": -1})
    image = [{"role": "user", "content": [
        {"type": "text", "text": "what is this?", "cache_control": {"type": "ephemeral"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    with pytest.raises(openai.BadRequestError, match=r"image_url.*text only"):
        client.chat.completions.create(model="tiny", messages=image)  # type: ignore[arg-type]
    cached = [{"role": "user", "content": [
        {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}]}]
    ok = client.chat.completions.create(model="tiny", messages=cached,  # type: ignore[arg-type]
                                        max_tokens=2)
    assert ok.choices[0].message.role == "assistant"


def test_legacy_completion_defaults_are_taken_and_their_other_values_named(
        client: openai.OpenAI) -> None:
    got = client.completions.create(model="tiny", prompt="the", max_tokens=3, temperature=0,
                                    echo=False, best_of=1, stop="")
    assert got.usage is not None and got.usage.completion_tokens == 3  # "" stops nothing
    for field, value in (("echo", True), ("best_of", 2), ("suffix", "end")):
        with pytest.raises(openai.BadRequestError, match=field):
            client.completions.create(model="tiny", prompt="the", max_tokens=2,
                                      **{field: value})  # type: ignore[arg-type]


def test_max_tokens_holds_when_the_answer_ends_inside_a_character(
        client: openai.OpenAI, reference: Llama) -> None:
    # llama-cpp-python checks max_tokens only after a token that completes a character: an
    # emoji's lead byte, then its continuation bytes, ran past the limit (4 gave 6)
    lead = next(i for i in range(reference.n_vocab()) if reference.detokenize([i]) == b"\xf0")
    for stream in (False, True):
        got = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "an emoji"}], max_tokens=4,
            temperature=0, logit_bias={str(lead): 100}, stream=stream,  # type: ignore[call-overload]
            **({"stream_options": {"include_usage": True}} if stream else {}))
        if stream:
            chunks = list(got)
            usage = chunks[-1].usage
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            usage, finish = got.usage, got.choices[0].finish_reason
        assert usage is not None and usage.completion_tokens == 4, (stream, usage)
        assert finish == "length"
