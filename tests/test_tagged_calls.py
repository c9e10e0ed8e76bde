"""A model whose chat template renders the tools and asks for each call inside
``<tool_call>`` tags (Hermes 2 Pro and 3, Qwen 2.5 and 3: the chat models most edge boxes
serve), through the real ``openai`` and ``ollama`` clients.

SmolLM2 is ChatML as those models are; the template below, written here in their style, is
given to it as a ``[[models]] chat_template``. It refuses an earlier call whose ``arguments``
is a string: such templates write ``arguments | tojson`` and expect the object (OpenAI sends
a JSON string; a string came out quoted and escaped)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest
from daemon_proc import DaemonProcess
from models_fixtures import module_tmp, smollm2_gguf, start_daemon  # noqa: F401

pytestmark = pytest.mark.timeout(900)

HERMES = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call functions. Their signatures:
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
For each call, write a JSON object inside tags:
<tool_call>
{"name": <function name>, "arguments": <arguments object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{% if m.content %}{{ m.content }}{% endif %}
{%- for c in m.tool_calls or [] %}
{%- if c.function.arguments is string %}{{ raise_exception('arguments is a string') }}{% endif %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}<|im_start|>assistant
"""

# Llama 3's way, in ChatML for SmolLM2: the tools in the prompt, a call answered as
# {"name": ..., "parameters": ...} with no tags, earlier calls written back so
LLAMA3 = """{%- if tools %}<|im_start|>system
You have access to these functions. To call one, respond with JSON in the format {"name": \
function name, "parameters": dictionary of argument name and its value}. Do not use variables.
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{%- for c in m.tool_calls %}
{%- if c.function.arguments is string %}{{ raise_exception('arguments is a string') }}{% endif %}
{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>ipython
{{ m.content }}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}<|im_start|>assistant
"""

TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                   "properties": {"city": {"type": "string", "maxLength": 30}}}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def daemon(module_tmp: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    shutil.copy(smollm2_gguf(), models / "smol.gguf")
    (models / "hermes.jinja").write_text(HERMES)
    (models / "llama3.jinja").write_text(LLAMA3)
    d = start_daemon(module_tmp, "[backends.llamacpp]\nn_ctx = 1024\n"
                     '[[models]]\nname = "hermes"\nfile = "smol.gguf"\n'
                     'chat_template = "hermes.jinja"\nload_at_start = false\n'
                     '[[models]]\nname = "llama3"\nfile = "smol.gguf"\n'
                     'chat_template = "llama3.jinja"\nload_at_start = false\n')
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def oa(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)


def test_calls_through_a_template_that_tags_them(oa: openai.OpenAI, daemon: DaemonProcess
                                                 ) -> None:
    got = oa.chat.completions.create(model="hermes", messages=ASK,  # type: ignore[arg-type]
                                     tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                     temperature=0, max_tokens=60)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = (choice.message.tool_calls or [])[0]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert set(json.loads(call.function.arguments)) == {"city"}  # type: ignore[union-attr]
    # streamed: the same call, its arguments as they are generated
    chunks = list(oa.chat.completions.create(
        model="hermes", messages=ASK, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
        temperature=0, max_tokens=60, stream=True))
    streamed = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert streamed[0].function is not None and streamed[0].function.name == "get_weather"
    assert json.loads("".join(tc.function.arguments or "" for tc in streamed if tc.function)) \
        == json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)
    # the call and its result go back: the template renders the call's arguments as the
    # object (it refuses a string), and the model answers
    follow = [*ASK, choice.message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'}]
    after = oa.chat.completions.create(model="hermes", messages=follow,  # type: ignore[arg-type]
                                       tools=TOOLS, max_tokens=30, temperature=0)
    assert after.choices[0].message.content or after.choices[0].message.tool_calls
    # under "auto" the model writes the tags it was trained to (after a newline, as SmolLM2
    # opens its turns): a call, never text holding tags
    auto = oa.chat.completions.create(model="hermes", messages=ASK,  # type: ignore[arg-type]
                                      tools=TOOLS, temperature=0, max_tokens=60)
    assert "<tool_call>" not in (auto.choices[0].message.content or "")
    assert auto.choices[0].message.tool_calls and auto.choices[0].finish_reason == "tool_calls"
    # Ollama's chat, as its client reads it: arguments an object
    client = ollama.Client(host=daemon.url)
    answer = client.chat(model="hermes", messages=ASK, tools=TOOLS,
                         options={"temperature": 0, "num_predict": 60})
    if answer.message.tool_calls:  # Ollama has no tool_choice: the model may answer in text
        assert answer.message.tool_calls[0].function.name == "get_weather"
        assert "<tool_call>" not in (answer.message.content or "")
    else:
        assert answer.message.content and not answer.message.content.startswith("<")


def test_calls_through_a_template_asking_for_parameters(oa: openai.OpenAI) -> None:
    """The model writes the key its template asks for; the call comes back as OpenAI's, its
    arguments what it wrote under ``parameters``, and goes back to the template as the object
    its ``parameters`` holds."""
    for stream in (False, True):
        kwargs: dict[str, Any] = dict(model="llama3", messages=ASK, tools=TOOLS,
                                      tool_choice="required", temperature=0, max_tokens=40)
        if stream:
            chunks = list(oa.chat.completions.create(stream=True, **kwargs))
            deltas = [tc for c in chunks if c.choices
                      for tc in c.choices[0].delta.tool_calls or []]
            assert deltas[0].function is not None and deltas[0].function.name == "get_weather"
            arguments = "".join(tc.function.arguments or "" for tc in deltas if tc.function)
        else:
            got = oa.chat.completions.create(**kwargs)
            call = (got.choices[0].message.tool_calls or [])[0]
            assert got.choices[0].finish_reason == "tool_calls"
            assert call.function.name == "get_weather"  # type: ignore[union-attr]
            arguments = call.function.arguments  # type: ignore[union-attr]
        assert set(json.loads(arguments)) == {"city"}
    follow = [*ASK, got.choices[0].message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'}]
    after = oa.chat.completions.create(model="llama3", messages=follow,  # type: ignore[arg-type]
                                       tools=TOOLS, max_tokens=20, temperature=0)
    assert after.choices[0].message.content or after.choices[0].message.tool_calls
