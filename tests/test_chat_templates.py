"""Chat templates: a real GGUF without one (Gemma 3 270M) gets its architecture's, a
``[[models]] chat_template`` file overrides a GGUF's own, templates render in a sandbox, and
``/v1/models`` / ``/api/show`` say which template a model renders with."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest
from daemon_proc import DaemonProcess
from models_fixtures import gemma3_gguf, module_tmp, smollm2_gguf, start_daemon  # noqa: F401

from edgepilot.formats.gguf_info import read_gguf_info

QUESTION = [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"}]
# the override: plain lines, refusing a conversation that does not end with the user
PLAIN = ("{% if messages[-1].role != 'user' %}{{ raise_exception('the last message must be "
         "the user\\'s') }}{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n"
         "{% endfor %}assistant:")
ESCAPE = "{{ ''.__class__.__mro__[1].__subclasses__() }}"


@pytest.fixture(scope="module")
def daemon(module_tmp: Path, gemma3_gguf: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    shutil.copy(smollm2_gguf(), models / "smol.gguf")
    shutil.copy(gemma3_gguf, models / "gemma.gguf")
    (models / "plain.jinja").write_text(PLAIN)
    (models / "escape.jinja").write_text(ESCAPE)
    d = start_daemon(module_tmp, "[backends.llamacpp]\nn_ctx = 512\n"
                     '[[models]]\nname = "smol"\nfile = "smol.gguf"\nload_at_start = false\n'
                     '[[models]]\nname = "gemma"\nfile = "gemma.gguf"\nload_at_start = false\n'
                     '[[models]]\nname = "smol-plain"\nfile = "smol.gguf"\n'
                     'chat_template = "plain.jinja"\nload_at_start = false\n'
                     '[[models]]\nname = "smol-escape"\nfile = "smol.gguf"\n'
                     'chat_template = "escape.jinja"\nload_at_start = false\n')
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def oa(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)


def test_the_models_say_which_template(daemon: DaemonProcess) -> None:
    assert read_gguf_info(daemon.tmp / "models" / "gemma.gguf").chat_template is None
    code, body = daemon.request("GET", "/v1/models")
    assert code == 200
    said = {m["id"]: m.get("chat_template") for m in body["data"]}
    assert said["smol"] == {"source": "gguf", "name": "gguf"}
    assert said["gemma"] == {"source": "architecture", "name": "gemma"}
    assert said["smol-plain"] == {"source": "file", "name": "plain.jinja"}
    shown = ollama.Client(host=daemon.url).show("gemma")
    assert shown.template and "<start_of_turn>" in shown.template


def _chat_then_completion(oa: openai.OpenAI, model: str, prompt: str) -> tuple[str, str]:
    # llama.cpp reuses the previous prompt's cached prefix, and the first greedy answer after
    # another prompt can differ: each answer compared is asked right after the same prompt
    def chat() -> str:
        got = oa.chat.completions.create(model=model, messages=QUESTION,  # type: ignore[arg-type]
                                         temperature=0, max_tokens=16)
        assert got.usage is not None and got.usage.completion_tokens > 0
        return got.choices[0].message.content or ""

    def complete() -> str:
        return oa.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=16,
                                     stop=["<end_of_turn>", "\nuser:"]).choices[0].text

    chat()
    complete()
    return chat(), complete()


def test_a_gguf_without_template_chats_through_its_architectures(oa: openai.OpenAI) -> None:
    rendered = ("<start_of_turn>user\nAnswer briefly.\n\nWhat is the capital of France?"
                "<end_of_turn>\n<start_of_turn>model\n")
    chat, completion = _chat_then_completion(oa, "gemma", rendered)
    assert chat.strip(), "an empty answer: the template was not applied"
    assert chat == completion


def test_a_template_file_overrides_and_renders_sandboxed(oa: openai.OpenAI) -> None:
    rendered = "system: Answer briefly.\nuser: What is the capital of France?\nassistant:"
    chat, completion = _chat_then_completion(oa, "smol-plain", rendered)
    assert chat == completion
    with pytest.raises(openai.BadRequestError) as refused:
        oa.chat.completions.create(model="smol-plain", max_tokens=4, messages=[
            *QUESTION, {"role": "assistant", "content": "Paris."}])
    assert isinstance(refused.value.body, dict) and refused.value.body["field"] == "messages"
    assert "the last message must be the user's" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as escape:
        oa.chat.completions.create(model="smol-escape", messages=QUESTION,  # type: ignore[arg-type]
                                   max_tokens=4)
    assert isinstance(escape.value.body, dict) and escape.value.body["field"] == "messages"
    assert "unsafe" in escape.value.body["message"]
