"""Streamed tool calls: the answer's text, read as it is generated, sent as OpenAI's
``tool_calls`` deltas that add up to the whole answer's calls (``http/call_chunks.py``).

The chunks here are the backend's shape (llama-cpp-python's chat chunks, one token each);
the whole path's parse of the same text is the reference for every answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from edgepilot.http.call_chunks import streamed_calls
from edgepilot.http.openai_tools import with_tool_calls
from edgepilot.serving.call_stream import answer_kind, calls_so_far, value_end
from edgepilot.serving.generate import StreamEnd
from edgepilot.serving.tools import tool_request

TOOLS = [{"type": "function", "function": {
    "name": n, "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    for n in ("get_weather", "get_time")]
ASK = [{"role": "user", "content": "Weather and time in Paris?"}]


def _pieces(text: str) -> list[str]:
    """The text cut as a tokenizer might: a few characters at a time, quotes and braces
    sometimes alone, sometimes with their neighbours."""
    out, i, k = [], 0, 0
    while i < len(text):
        n = 1 + (k * 7) % 4
        out.append(text[i:i + n])
        i, k = i + n, k + 1
    return out


# a template that renders tools and asks for each call inside <tool_call> tags (Hermes, Qwen)
TAGGING = "{% for t in tools %}{{ t | tojson }}{% endfor %} Write <tool_call>{...}</tool_call>"
# one that asks for the arguments under "parameters" (Llama 3.1-3.3)
PARAMETERS = ("{% for t in tools %}{{ t | tojson }}{% endfor %} Respond in the format "
              '{"name": function name, "parameters": dictionary of argument name and its value}.')


def _stream(text: str, finish: str, template: str | None = None) -> list[dict[str, Any]]:
    """Send ``text`` as a tools-grammar answer ending with ``finish``; the chunks sent."""
    tools = tool_request(ASK, TOOLS, "auto", template)
    chunks: list[Any] = [{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant"},
                                                  "finish_reason": None}]}]
    for k, piece in enumerate(_pieces(text)):
        chunks.append({"id": "c", "choices": [{
            "index": 0, "delta": {"content": piece}, "finish_reason": None,
            "logprobs": {"content": [{"token": piece, "logprob": -float(k)}]}}]})
    chunks.append({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    chunks.append(StreamEnd({"completion_tokens": len(chunks) - 2}, {}))

    async def items() -> AsyncGenerator[Any, None]:
        for c in chunks:
            yield c

    async def run() -> list[Any]:
        return [c async for c in streamed_calls(items(), tools)]

    got = asyncio.run(run())
    assert isinstance(got[-1], StreamEnd)
    sent = got[:-1]
    # every token's logprobs are sent once, in order, whatever chunk carries them
    entries = [e for c in sent for e in (c["choices"][0].get("logprobs") or {}).get("content")
               or []]
    assert [e["token"] for e in entries] == _pieces(text)
    assert sent[0]["choices"][0]["delta"]["role"] == "assistant"
    return sent


def _whole(text: str, finish: str, template: str | None = None) -> dict[str, Any]:
    tools = tool_request(ASK, TOOLS, "auto", template)
    result = {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                           "finish_reason": finish}]}
    return with_tool_calls(result, tools)["choices"][0]


def _assembled(sent: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str, str | None]:
    """What a client builds from the chunks: calls by index, content, finish reason."""
    calls: dict[int, dict[str, Any]] = {}
    content, finish = "", None
    for chunk in sent:
        choice = chunk["choices"][0]
        content += choice["delta"].get("content") or ""
        for tc in choice["delta"].get("tool_calls") or []:
            slot = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            slot["id"] = slot["id"] or tc.get("id")
            slot["name"] += tc.get("function", {}).get("name") or ""
            slot["arguments"] += tc.get("function", {}).get("arguments") or ""
        finish = choice.get("finish_reason") or finish
    return [calls[k] for k in sorted(calls)], content, finish


def _streamed_as_whole(text: str, template: str, count: int) -> None:
    """``text``'s calls, streamed and whole, are the same: the first ``count`` of
    get_weather and get_time on Paris."""
    calls, content, finish = _assembled(_stream(text, "stop", template))
    whole = _whole(text, "stop", template)
    assert finish == whole["finish_reason"] == "tool_calls" and content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in whole["message"]["tool_calls"]] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"city": "Paris"})][:count]


TAGGED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>',
]


@pytest.mark.parametrize("text", TAGGED)
def test_calls_in_tags_add_up_to_the_whole_answers(text: str) -> None:
    """Hermes and Qwen templates ask for each call inside <tool_call> tags: written so under
    ``auto``, a call was taken for text (its first character is no ``{``) and came back as
    ``content`` holding the tags."""
    tools = tool_request(ASK, TOOLS, "auto", TAGGING)
    assert tools.tagged and tool_request(ASK, TOOLS, "auto", None).tagged is False
    _streamed_as_whole(text, TAGGING, text.count("<tool_call>"))


@pytest.mark.parametrize("text", [
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
    '{"name": "get_time", "parameters": {"city": "Paris"}}]',
])
def test_calls_with_their_arguments_under_parameters(text: str) -> None:
    """Llama 3's templates ask for ``"parameters"``: the grammar forced ``"arguments"``
    instead, a key the model was not trained to write."""
    assert tool_request(ASK, TOOLS, "auto", PARAMETERS).key == "parameters"
    assert tool_request(ASK, TOOLS, "auto", TAGGING).key == "arguments"
    _streamed_as_whole(text, PARAMETERS, text.count('"name"'))


def test_a_template_rendering_calls_gets_their_arguments_as_objects() -> None:
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]
    sent = tool_request(history, TOOLS, "auto", TAGGING).messages
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert history[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'


@pytest.mark.parametrize("text", [
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '[{"name": "get_weather", "arguments": {"city": "Pa\\"ris {x}"}}]',
    '[ {"name":"get_weather","arguments":{"city":"Paris"}},\n {"name": "get_time", '
    '"arguments": {}} ]',
    # a repeated call is meant once, as the whole answer has it
    '[{"name": "get_time", "arguments": {"city": "Oslo"}}, {"name": "get_time", '
    '"arguments": {"city":"Oslo"}}, '
    '{"name": "get_weather", "arguments": {"city": "Rome"}}]',
])
def test_calls_add_up_to_the_whole_answers(text: str) -> None:
    sent = _stream(text, "stop")
    calls, content, finish = _assembled(sent)
    whole = _whole(text, "stop")
    assert finish == whole["finish_reason"] == "tool_calls" and content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in whole["message"]["tool_calls"]]
    assert all(c["id"].startswith("call_") for c in calls)
    # the first call's arguments arrive in pieces, not whole at the end
    first = [tc for c in sent for tc in c["choices"][0]["delta"].get("tool_calls") or []
             if tc["index"] == 0]
    assert first[0]["function"] == {"name": calls[0]["name"], "arguments": ""}
    assert len(first) > 3


@pytest.mark.parametrize("text", [
    "Paris is sunny today.",
    '{"city": "Paris", "temp": 21}',  # JSON answering a schema, not a call
    '{"name": "get_weather", "temp": 21}',  # nor one whose "name" is a tool's
    '{"name": "Bob", "arguments": {}}',  # "name" opening it, but no tool of that name
])
def test_an_answer_that_is_no_call_is_content(text: str) -> None:
    calls, content, finish = _assembled(_stream(text, "stop"))
    whole = _whole(text, "stop")
    assert calls == [] and content == text == whole["message"]["content"]
    assert finish == whole["finish_reason"] == "stop"


@pytest.mark.parametrize("text", [
    '{"name": "get_weather", "arguments": {"city": "Par',
    '{"name": "get_weather"',  # cut before its arguments began
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
])
def test_a_call_cut_by_max_tokens_is_the_call_as_far_as_it_went(text: str) -> None:
    template = TAGGING if text.startswith("<") else None
    calls, content, finish = _assembled(_stream(text, "length", template))
    whole = _whole(text, "length", template)
    cut = whole["message"]["tool_calls"][0]["function"]
    assert finish == whole["finish_reason"] == "length" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [(cut["name"], cut["arguments"])]


def test_an_answer_is_a_call_only_once_its_head_is_written() -> None:
    names = ["get_weather"]
    assert [answer_kind(t, names) for t in ("", " [", '{"na', '[{"name": "get_w')] \
        == [None] * 4
    assert answer_kind('{"name": "get_weather", "arguments":', names) == "call"
    assert answer_kind('{"name": "other"', names) == "text"
    assert answer_kind("Sunny.", names) == "text" and answer_kind("<b>Sunny", names) == "text"
    assert [answer_kind(t, names) for t in ("<tool_", "<tool_call>\n{")] == [None] * 2
    assert answer_kind('<tool_call>\n{"name": "get_weather", "arguments": ', names) == "call"
    assert calls_so_far('{"name": "get_weather", "arguments": {"city": "Pa', names)[0] \
        .arguments == '{"city": "Pa'
    # a value ends at its own close, not at a brace inside one of its strings
    assert value_end('{"a": "}"} tail', 0) == 10
    assert value_end('12, "b"', 0) == 2 and value_end("12", 0) is None
    assert value_end('"a\\"b" x', 0) == 6
    # a string still open: its escaped quote, a trailing backslash, a brace inside it
    assert value_end('{"a": "x\\"}', 0) is None and value_end('{"a": "x\\', 0) is None
    assert value_end('{"a": "}', 0) is None and value_end('[{"a": ["]"]}, 2] x', 0) == 17
