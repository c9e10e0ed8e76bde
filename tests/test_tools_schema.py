"""Tool calls and structured output with the official ``openai`` and ``ollama`` clients against
a real daemon serving SmolLM2-135M-Instruct (its template renders no tools: the generic prompt)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import jsonschema
import ollama
import openai
import pytest
from daemon_proc import DaemonProcess
from models_fixtures import module_tmp, smol_daemon, smollm2_gguf  # noqa: F401
from pydantic import BaseModel, Field

from edgepilot.backends.llamacpp.backend import LlamaCppBackend
from edgepilot.backends.llamacpp.grammar import schema_gbnf
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.serving.tools import tool_request

# grammar-constrained generation samples against the grammar token by token: on a loaded
# 2-core machine a test here takes minutes
pytestmark = pytest.mark.timeout(900)


def _tool(name: str, what: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": f"{what} a device or an entity",
        "parameters": {"type": "object", "required": ["name"], "additionalProperties": False,
                       "properties": {"name": {"type": "string", "maxLength": 40},
                                      "area": {"type": "string", "maxLength": 40}}}}}


# the shapes a home-automation conversation agent sends: its system prompt lists the devices
TOOLS = [_tool("HassTurnOn", "Turns on"), _tool("HassTurnOff", "Turns off")]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [
    {"role": "system", "content": "You are a voice assistant for Home Assistant.\n"
     "An overview of the areas and the devices in this smart home:\n"
     "- names: Kitchen Light\n  domain: light\n  state: 'off'\n  areas: Kitchen\n"
     "- names: Heater\n  domain: climate\n  state: 'on'\n  areas: Hall\n"},
    {"role": "user", "content": "Turn on the kitchen light."}]


@pytest.fixture(scope="module")
def daemon(module_tmp: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    d = smol_daemon(module_tmp)
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def oa(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)


def _valid_call(name: str, arguments: dict[str, Any]) -> None:
    assert name in SCHEMAS
    jsonschema.validate(arguments, SCHEMAS[name])


def test_required_tool_call_round_trip_streamed_and_not(oa: openai.OpenAI) -> None:
    got = oa.chat.completions.create(model="smol", messages=MESSAGES,  # type: ignore[arg-type]
                                     tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                     temperature=0, max_tokens=60, logprobs=True,
                                     top_logprobs=2)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls
    call = choice.message.tool_calls[0]
    _valid_call(call.function.name, json.loads(call.function.arguments))
    stream = oa.chat.completions.create(model="smol", messages=MESSAGES,  # type: ignore[arg-type]
                                        tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                        temperature=0, max_tokens=60, stream=True,
                                        stream_options={"include_usage": True},
                                        logprobs=True, top_logprobs=2)
    chunks = list(stream)
    # the call's tokens' logprobs, streamed as in the whole answer
    assert choice.logprobs is not None and choice.logprobs.content
    assert [e for c in chunks if c.choices and c.choices[0].logprobs
            for e in c.choices[0].logprobs.content or []] == choice.logprobs.content
    # the call is announced (its id and name) as soon as the model has written them, then
    # its arguments follow as they are generated: they add up to the whole answer's
    streamed = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert streamed[0].id and streamed[0].function is not None
    assert streamed[0].function.name == call.function.name  # type: ignore[union-attr]
    assert len(streamed) > 3 and all(tc.index == 0 and tc.id is None for tc in streamed[1:])
    assert json.loads("".join(tc.function.arguments or "" for tc in streamed if tc.function)) \
        == json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # the SDK's own stream helper reads it as it reads OpenAI's: argument deltas, then the call
    with oa.chat.completions.stream(model="smol", messages=MESSAGES,  # type: ignore[arg-type]
                                    tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                    temperature=0, max_tokens=60) as helper:
        kinds = [e.type for e in helper]
        final = helper.get_final_completion()
    assert kinds.count("tool_calls.function.arguments.delta") > 3
    assert kinds.count("tool_calls.function.arguments.done") == 1
    helped = (final.choices[0].message.tool_calls or [])[0]
    assert helped.function.name == call.function.name  # type: ignore[union-attr]
    assert json.loads(helped.function.arguments) \
        == json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert chunks[-1].usage is not None and got.usage is not None
    assert chunks[-1].usage.completion_tokens == got.usage.completion_tokens
    # the call and its result go back; the model answers (text or another call)
    follow = [*MESSAGES, choice.message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": call.id, "content": '{"success": true}'}]
    after = oa.chat.completions.create(model="smol", messages=follow,  # type: ignore[arg-type]
                                       tools=TOOLS, max_tokens=30)
    assert after.choices[0].message.content or after.choices[0].message.tool_calls


def test_a_named_tool_is_the_one_called(oa: openai.OpenAI) -> None:
    got = oa.chat.completions.create(
        model="smol", messages=MESSAGES, tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "HassTurnOff"}},
        max_tokens=60, seed=3)
    calls = got.choices[0].message.tool_calls
    assert calls and [c.function.name for c in calls] == ["HassTurnOff"]
    _valid_call("HassTurnOff", json.loads(calls[0].function.arguments))


def test_bad_tools_and_choices_are_400_naming_the_field(oa: openai.OpenAI) -> None:
    cases = [({"tool_choice": {"type": "function", "function": {"name": "HassExplode"}}},
              "tool_choice.function.name"),
             ({"tools": [{"type": "function", "function": {
                 "name": "x", "parameters": {"type": "objekt"}}}]},
              "tools.0.function.parameters"),
             ({"response_format": {"type": "json_schema", "json_schema": {
                 "name": "s", "schema": {"type": "object", "required": "name"}}}},
              "response_format.json_schema.schema"),
             ({"response_format": {"type": "yaml"}}, "response_format.type")]
    for extra, field in cases:
        body = {"tools": TOOLS, **extra}
        with pytest.raises(openai.BadRequestError) as err:
            oa.chat.completions.create(model="smol", messages=MESSAGES,  # type: ignore[arg-type]
                                       max_tokens=5, **body)
        assert err.value.status_code == 400
        assert isinstance(err.value.body, dict) and err.value.body["field"] == field, extra


SWITCH = {"type": "object", "additionalProperties": False, "required": ["device", "on"],
          "properties": {"device": {"type": "string", "enum": ["kitchen light", "heater"]},
                         "on": {"type": "boolean"}}}


def test_json_schema_and_json_object_answers_validate(oa: openai.OpenAI) -> None:
    for seed in range(5):
        got = oa.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "Switch on the heater."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "switch", "schema": SWITCH}},
            seed=seed, max_tokens=40)
        jsonschema.validate(json.loads(got.choices[0].message.content or ""), SWITCH)
    obj = oa.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Reply with JSON: {\"ok\": true}"}],
        response_format={"type": "json_object"}, temperature=0, max_tokens=40)
    assert (obj.choices[0].message.content or "").startswith("{")


def test_ollama_tools_in_a_home_assistant_request(daemon: DaemonProcess) -> None:
    client = ollama.Client(host=daemon.url)
    got = client.chat(model="smol", messages=MESSAGES, tools=TOOLS, keep_alive=-1,
                      options={"num_ctx": 8192, "temperature": 0, "num_predict": 60})
    assert got.done
    # Ollama has no tool_choice: the model may call a tool or answer in text. SmolLM2-135M
    # opens a list here, the form it was trained to call tools in (`[{"name": ...}]`): a call
    assert got.message.tool_calls, got.message.content
    for call in got.message.tool_calls:
        _valid_call(call.function.name, dict(call.function.arguments))
    follow = [*MESSAGES, {"role": "assistant", "tool_calls": [
                  {"function": {"name": "HassTurnOn", "arguments": {"name": "Kitchen Light"}}}]},
              {"role": "tool", "tool_name": "HassTurnOn", "content": '{"success": true}'}]
    after = client.chat(model="smol", messages=follow, tools=TOOLS,
                        options={"num_predict": 30})
    assert after.done and (after.message.content or after.message.tool_calls)


def test_under_auto_an_answer_opening_a_json_string_is_not_text() -> None:
    """SmolLM2-135M answers this home-automation request with ``"HassTurnOn" ...`` (a JSON
    string: it means a tool) when text may start with a quote; the auto grammar's text branch
    starts no JSON object, list or string, and its next choice is the call."""
    messages = [MESSAGES[0],
                {"role": "user", "content": "I'm cold, turn the heater on please."}]
    tools = tool_request(messages, TOOLS, "auto", None)
    exe = LlamaCppBackend(LlamacppSection(n_ctx=1024)).open(smollm2_gguf())
    try:
        # its first tokens are the choice (the grammar makes the rest of a call valid)
        out = exe.chat(tools.messages, temperature=0, max_tokens=8, **tools.params)
    finally:
        exe.close()
    text = out["choices"][0]["message"]["content"] or ""
    assert text.startswith(("[", "{")) and "\"name\"" in text, text


class Poem(BaseModel):
    code: str


def test_structured_strings_hold_no_raw_control_characters(oa: openai.OpenAI) -> None:
    """JSON forbids a raw newline inside a string; llama-cpp-python's schema converter allowed
    one, and SmolLM2 writes poetry lines with them (seed 1 did, before): each answer must load
    with a strict parser, through the SDK's own `.parse()` too."""
    assert "\\x00-\\x1F" in schema_gbnf({"type": "object"}, "format")
    prompt = [{"role": "user", "content": "Write two short lines of poetry."}]
    finished = 0
    for seed in (1, 2, 3):
        try:
            got = oa.chat.completions.parse(
                model="smol", messages=prompt,  # type: ignore[arg-type]
                response_format=Poem, seed=seed, temperature=0.7, max_tokens=48)
        except openai.LengthFinishReasonError:
            continue  # cut off by max_tokens: no JSON yet, and the SDK says so
        finished += 1
        assert isinstance(got.choices[0].message.parsed, Poem)
        json.loads(got.choices[0].message.content or "")  # strict: no raw control characters
    assert finished


def test_the_deprecated_functions_are_answered_as_function_call(oa: openai.OpenAI) -> None:
    # OpenAI's API still takes them and older clients (LangChain's legacy agents) send them
    functions = [t["function"] for t in TOOLS]
    got = oa.chat.completions.create(model="smol", messages=MESSAGES,  # type: ignore[arg-type]
                                     functions=functions,  # type: ignore[arg-type]
                                     function_call={"name": "HassTurnOn"}, max_tokens=60,
                                     temperature=0)
    choice = got.choices[0]
    assert choice.finish_reason == "function_call" and not choice.message.tool_calls
    call = choice.message.function_call
    assert call is not None and call.name == "HassTurnOn"
    _valid_call(call.name, json.loads(call.arguments))
    streamed = list(oa.chat.completions.create(
        model="smol", messages=MESSAGES, functions=functions,  # type: ignore[arg-type]
        function_call={"name": "HassTurnOn"}, max_tokens=60, temperature=0, stream=True))
    parts = [c.choices[0].delta.function_call for c in streamed
             if c.choices and c.choices[0].delta.function_call]
    assert [(p.name, p.arguments) for p in parts] == [(call.name, call.arguments)]
    # its result goes back as a function message, answering the call by name
    follow = [*MESSAGES, choice.message.model_dump(),
              {"role": "function", "name": "HassTurnOn", "content": '{"success": true}'}]
    after = oa.chat.completions.create(model="smol", messages=follow,  # type: ignore[arg-type]
                                       functions=functions, max_tokens=20)
    assert after.choices[0].finish_reason in ("stop", "length", "function_call")
    with pytest.raises(openai.BadRequestError, match="not both"):
        oa.chat.completions.create(model="smol", messages=MESSAGES,  # type: ignore[arg-type]
                                   functions=functions, tools=TOOLS)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="request with the deprecated functions"):
        oa.chat.completions.create(model="smol", messages=follow)  # type: ignore[arg-type]


class Area(BaseModel):
    floor: int
    room: str


class Power(StrEnum):
    on = "on"
    off = "off"


class SetDevice(BaseModel):
    """Switch a device in an area."""

    device: str
    power: Power
    area: Area


class Node(BaseModel):
    name: str
    children: list[Node] = []


def test_pydantic_tools_and_recursive_schemas_with_their_defs(oa: openai.OpenAI) -> None:
    """A pydantic model's schema keeps its nested models and enums in ``$defs`` (the OpenAI
    SDK's ``pydantic_function_tool``, pydantic-ai, openai-agents): a 400 before, as the refs
    resolved against the call's root once the schema sat inside it."""
    tool = openai.pydantic_function_tool(SetDevice)
    assert "$defs" in json.dumps(tool)  # what the SDK sends
    plain = openai.pydantic_function_tool(Area)  # tools with and without $defs, side by side
    assert "$defs" not in json.dumps(plain)
    got = oa.chat.completions.parse(
        model="smol", messages=[{"role": "user", "content": "Turn the lamp in the hall on."}],
        tools=[tool, plain], tool_choice={"type": "function", "function": {"name": "SetDevice"}},
        temperature=0, max_tokens=80)
    calls = got.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "SetDevice"
    parsed = calls[0].function.parsed_arguments  # the SDK's own parse into the model
    assert isinstance(parsed, SetDevice) and isinstance(parsed.area, Area)
    assert parsed.power in (Power.on, Power.off)
    # an agent loop sends the parsed answer back as it came: the SDK's ``parsed`` and
    # ``parsed_arguments`` ride along (a 400 "Extra inputs are not permitted" before)
    echoed = got.choices[0].message
    assert "parsed_arguments" in echoed.model_dump()["tool_calls"][0]["function"]
    after = oa.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Turn the lamp in the hall on."},
                                echoed,  # type: ignore[list-item]
                                {"role": "tool", "tool_call_id": calls[0].id, "content": "ok"},
                                {"role": "assistant", "content": "", "reasoning_content": "."},
                                {"role": "user", "content": "thanks"}],
        max_tokens=4, temperature=0)
    assert after.choices[0].message.role == "assistant"
    # a recursive model: its schema's root is a $ref (or refers to itself)
    for schema in (Node.model_json_schema(),
                   {"type": "object", "required": ["name"], "properties": {
                       "name": {"type": "string"},
                       "children": {"type": "array", "items": {"$ref": "#"}}}}):
        answer = oa.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "A tree of two rooms."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "tree", "schema": schema}},
            temperature=0, max_tokens=60)
        text = answer.choices[0].message.content or ""
        if answer.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(text), schema)
        assert text.startswith("{")


def test_several_calls_in_one_answer_and_parallel_tool_calls_false(oa: openai.OpenAI) -> None:
    tools = tool_request(MESSAGES, TOOLS, "auto", None)
    on = {"name": "HassTurnOn", "arguments": {"name": "Kitchen Light"}}
    off = {"name": "HassTurnOff", "arguments": {"name": "Heater"}}
    calls = tools.parse(json.dumps([on, off]))
    assert calls is not None and [c["function"]["name"] for c in calls] == [
        "HassTurnOn", "HassTurnOff"] and calls[0]["id"] != calls[1]["id"]
    assert tools.parse(json.dumps([on, on])) is not None and \
        len(tools.parse(json.dumps([on, on])) or []) == 1  # a repeated call means one
    # SmolLM2 allowed several went on calling until max_tokens: the complete calls stand
    cut = tools.parse(json.dumps([on, off])[:-1] + ', {"name": "HassTurnOn", "argum')
    assert cut is not None and [json.loads(c["function"]["arguments"]) for c in cut] == [
        on["arguments"], off["arguments"]]
    assert tools.parse('{"name": "HassTurnOn", "arguments": {"na') is None  # no complete call
    # the grammar: a list of one call or several, or (parallel_tool_calls false) of one
    one = tool_request(MESSAGES, TOOLS, "required", None, parallel=False)
    assert '("," space call)*' in tools.params["grammar"]._grammar
    assert '("," space call)*' not in one.params["grammar"]._grammar
    messages = [MESSAGES[0], {"role": "user",
                              "content": "Turn off the heater and the kitchen light."}]
    got = oa.chat.completions.create(model="smol", messages=messages,  # type: ignore[arg-type]
                                     tools=TOOLS, tool_choice="auto",  # type: ignore[arg-type]
                                     temperature=0, max_tokens=80)
    several = got.choices[0].message.tool_calls or []
    assert several and got.choices[0].finish_reason == "tool_calls"
    for call in several:
        _valid_call(call.function.name, json.loads(call.function.arguments))
    single = oa.chat.completions.create(model="smol", messages=messages,  # type: ignore[arg-type]
                                        tools=TOOLS, tool_choice="auto",  # type: ignore[arg-type]
                                        temperature=0, max_tokens=80, parallel_tool_calls=False)
    assert len(single.choices[0].message.tool_calls or []) == 1


class Flight(BaseModel):
    """Regex-escape patterns: they crashed the llama.cpp worker on every retry (``\\d``
    reached llama.cpp's grammar parser as an unknown escape)."""

    code: str = Field(pattern=r"^[A-Z]{2}\d{3}$")
    gate: str = Field(pattern=r"^[A-Z]\.\d$")


def test_patterns_with_regex_escapes_and_untyped_lists_constrain_the_answer(
        oa: openai.OpenAI) -> None:
    import re

    got = oa.chat.completions.parse(
        model="smol", messages=[{"role": "user", "content": "Give a flight as JSON."}],
        response_format=Flight, temperature=0, max_tokens=60)
    flight = got.choices[0].message.parsed
    assert flight is not None  # the openai client validated it against the model
    assert re.fullmatch(r"[A-Z]{2}\d{3}", flight.code) and re.fullmatch(r"[A-Z]\.\d", flight.gate)
    # what a grammar cannot say is a 400 naming the field, not a worker's crash
    with pytest.raises(openai.BadRequestError) as err:
        oa.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "A word."}], max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": {
                "type": "object", "properties": {"w": {"type": "string",
                                                       "pattern": r"\bword\b"}}}}})
    assert "\\b" in str(err.value) and "response_format" in str(err.value)
    # an untyped list (``items: {}``: a list of anything) was a 400 (read as no items at all)
    tags = {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "required": ["tags"],
        "properties": {"tags": {"type": "array", "items": {}, "maxItems": 2}}}}}
    called = oa.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Tag this: red car"}],
        tools=[tags], tool_choice="required", max_tokens=60, temperature=0)
    assert called.choices[0].finish_reason in ("tool_calls", "length")


def test_regex_escapes_become_classes_llama_cpp_parses() -> None:
    from edgepilot.backends.llamacpp.patterns import safe_pattern
    from edgepilot.errors import CommandError

    assert safe_pattern(r"^[A-Z]{3}-\d{2}$", "f") == "^[A-Z]{3}-[0-9]{2}$"
    assert safe_pattern(r"^\w+\.\S$", "f") == r"^[a-zA-Z0-9_]+[\x2E][^ \t\n\r]$"
    assert safe_pattern(r"[\d\-]", "f") == r"[0-9\x2D]"
    assert safe_pattern(r"a\\b\n", "f") == r"a\\b\n"
    for bad in (r"\bword", r"(a)\1", r"[\D]", "x\\"):
        with pytest.raises(CommandError) as err:
            safe_pattern(bad, "format")
        assert err.value.field == "format"
    # every escape in the grammar built is one llama.cpp's parser knows
    gbnf = schema_gbnf({"type": "object", "properties": {
        "a": {"type": "string", "pattern": r"^\d+\.\d+ \(\w\)$"},
        "b": {"type": "array", "items": {}}}}, "format")
    escapes = {gbnf[i + 1] for i, c in enumerate(gbnf) if c == "\\" and gbnf[i - 1] != "\\"}
    assert escapes <= set('xuUtrn\\"[]'), escapes


def test_a_text_answer_under_auto_tools_streams_and_a_call_is_still_a_call(
        oa: openai.OpenAI, daemon: DaemonProcess) -> None:
    """Agents send their tools on every turn; an answer in text was generated whole under the
    grammar of a call or text (11x slower here, and a stream sent nothing until its end: zero
    bytes for ten minutes without num_predict). One token under that grammar now decides, and
    a text answer streams token by token; a call is parsed whole as before."""
    tools = [_tool("HassTurnOn", "Turns on")]
    question = [{"role": "user", "content": "What is the capital of France?"}]
    stream = oa.chat.completions.create(model="smol", messages=question, tools=tools,
                                        stream=True, max_tokens=30, temperature=0)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    text = [d.content for d in deltas if d.content]
    assert len(text) > 2 and not any(d.tool_calls for d in deltas)
    assert "".join(text)[0] not in '{["' and not "".join(text)[0].isspace()
    whole = oa.chat.completions.create(model="smol", messages=question, tools=tools,
                                       max_tokens=30, temperature=0)
    # (whole, the same text up to llama.cpp's greedy ties across KV-cache states: see README)
    assert whole.choices[0].message.content and not whole.choices[0].message.tool_calls
    call = oa.chat.completions.create(model="smol", messages=MESSAGES, tools=TOOLS,
                                      max_tokens=60, temperature=0)
    assert call.choices[0].message.tool_calls and call.choices[0].finish_reason == "tool_calls"
    # Ollama's chat: the same, as its client reads it
    client = ollama.Client(host=daemon.url)
    parts = [c.message.content for c in client.chat(
        model="smol", messages=question, tools=tools, stream=True,
        options={"temperature": 0, "num_predict": 30}) if c.message.content]
    assert len(parts) > 2 and "".join(parts)[0] not in '{["'


def test_a_call_cut_by_max_tokens_is_still_a_call(oa: openai.OpenAI) -> None:
    """A forced call cut off by max_tokens came back as its JSON fragment in ``content`` and
    no ``tool_calls`` (LangChain's ``.tool_calls`` was empty); OpenAI answers the call with its
    arguments as far as they went and ``finish_reason: "length"``."""
    for stream in (False, True):
        kwargs: dict[str, Any] = dict(
            model="smol", messages=MESSAGES, tools=TOOLS, max_tokens=12, temperature=0,
            tool_choice={"type": "function", "function": {"name": "HassTurnOn"}})
        if stream:
            chunks = list(oa.chat.completions.create(stream=True, **kwargs))
            calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices
                      and c.choices[0].finish_reason]
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert calls and calls[0].function and calls[0].function.name == "HassTurnOn"
            assert finish == ["length"] and content == ""
        else:
            got = oa.chat.completions.create(**kwargs)
            message = got.choices[0].message
            assert got.choices[0].finish_reason == "length" and message.content is None
            assert message.tool_calls and message.tool_calls[0].function.name == "HassTurnOn"
            with pytest.raises(json.JSONDecodeError):  # cut: as far as it went
                json.loads(message.tool_calls[0].function.arguments)


class Review(BaseModel):
    """Bounds and an ``Any`` field as pydantic writes them: the converter left ``minimum`` and
    ``maximum`` out (a rating bounded 1-5 came back 2022) and refused ``{"title": "Note"}``."""

    city: str = Field(max_length=20)
    stars: int = Field(ge=1, le=5)
    year: int = Field(ge=1990, le=2030)
    price: float = Field(ge=0)
    note: Any = None


def test_numeric_bounds_and_untyped_fields_constrain_the_answer(oa: openai.OpenAI) -> None:
    got = oa.chat.completions.parse(
        model="smol", messages=[{"role": "user", "content": "Review Paris as JSON."}],
        response_format=Review, temperature=0, max_tokens=80)
    review = got.choices[0].message.parsed
    assert review is not None  # the SDK validated it: the bounds held
    assert 1 <= review.stars <= 5 and 1990 <= review.year <= 2030 and review.price >= 0
    # a tool's bounded argument, as pydantic-ai and the Agents SDK declare it
    rate = {"type": "function", "function": {"name": "rate", "parameters": {
        "type": "object", "required": ["stars", "extra"], "additionalProperties": False,
        "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                       "extra": {"title": "Extra"}}}}}
    called = oa.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Rate the movie 123 stars."}],
        tools=[rate], tool_choice="required", max_tokens=60, temperature=0)
    calls = called.choices[0].message.tool_calls
    assert calls is not None
    args = json.loads(calls[0].function.arguments)
    assert 1 <= args["stars"] <= 5 and "extra" in args


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


def test_an_answer_schema_holds_beside_tools_under_auto(oa: openai.OpenAI,
                                                        daemon: DaemonProcess) -> None:
    """An agent with tools and an output type sends both: the answer was free text (the
    tools' grammar replaced the schema's), and every such agent run failed on invalid JSON.
    Under auto the answer is now a call or JSON valid against the schema."""
    tools = [_tool("HassTurnOn", "Turns on")]
    question = [{"role": "user", "content": "Paris is in France. Describe the city."}]
    schema = City.model_json_schema()
    got = oa.chat.completions.create(
        model="smol", messages=question, tools=tools, temperature=0, max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "City",
                                                                "schema": schema}})
    message = got.choices[0].message
    # the model chooses to answer (its first token is text under the call-or-text grammar),
    # and the answer it writes is the schema's JSON (it was "Paris is in France.")
    assert not message.tool_calls and got.choices[0].finish_reason == "stop", message
    assert City.model_validate_json(message.content or "").country
    client = ollama.Client(host=daemon.url)
    answer = client.chat(model="smol", messages=question, tools=tools, format=schema,
                         options={"temperature": 0, "num_predict": 60})
    if not answer.message.tool_calls:
        jsonschema.validate(json.loads(answer.message.content or ""), schema)


def test_a_bad_answer_schema_beside_tools_names_its_own_field() -> None:
    """With tools and an answer schema, an error in the answer schema named ``tools`` (the
    field its grammar was built under): it names where the schema came from."""
    from edgepilot.errors import CommandError
    from edgepilot.serving.tools import tool_request

    messages = [{"role": "user", "content": "hi"}]
    tools = [_tool("HassTurnOn", "Turns on")]
    bad = {"type": "object", "properties": {"w": {"type": "string", "pattern": r"\bword\b"}}}
    for field in ("response_format.json_schema.schema", "format"):
        with pytest.raises(CommandError) as err:
            tool_request(messages, tools, "auto", None, answer=bad, answer_field=field)
        assert err.value.field == field
    fine = tool_request(messages, tools, "auto", None, answer={"type": "object"},
                        answer_field="format")
    assert fine.answer is not None and fine.probe is not None


def test_an_agents_repeated_tools_are_converted_once_and_errors_each_time() -> None:
    """An agent sends the same tools every turn: their grammar is kept by the schema's text
    (in its key order: the order the grammar writes properties in), and a bad schema is
    refused each time under the field of the request at hand."""
    from edgepilot.backends.llamacpp.grammar import _cached_gbnf
    from edgepilot.errors import CommandError

    messages = [{"role": "user", "content": "hi"}]
    tools = [_tool("HassTurnOn", "Turns on"), _tool("HassTurnOff", "Turns off")]
    first = tool_request(messages, tools, "auto", None).params["grammar"]._grammar
    hits = _cached_gbnf.cache_info().hits
    again = tool_request(json.loads(json.dumps(messages)), json.loads(json.dumps(tools)),
                         "auto", None).params["grammar"]._grammar
    assert again == first and _cached_gbnf.cache_info().hits >= hits + 3  # 2 tools + the call
    swapped = {"type": "object", "properties": {"b": {"type": "integer"},
                                                "a": {"type": "string"}}}
    one, other = schema_gbnf(swapped, "format"), schema_gbnf(
        {"type": "object", "properties": dict(reversed(swapped["properties"].items()))},
        "format")
    assert "(b-kv b-rest" in one and "(a-kv a-rest" in other  # b first, as sent
    bad = {"type": "object", "properties": {"w": {"type": "string", "pattern": r"\bword\b"}}}
    for field in ("format", "format", "response_format.json_schema.schema"):
        with pytest.raises(CommandError) as err:
            schema_gbnf(bad, field)
        assert err.value.field == field


def test_a_tool_result_is_named_by_the_call_it_answers() -> None:
    """OpenAI's tool messages carry the call's id, not the tool's name: the generic prompt
    said "Result of the tool" for every result, and a model with two tools could not tell
    which one answered."""
    calls = [{"id": "call_a", "type": "function",
              "function": {"name": "HassTurnOn", "arguments": '{"name": "Kitchen Light"}'}},
             {"id": "call_b", "type": "function",
              "function": {"name": "HassTurnOff", "arguments": '{"name": "Heater"}'}}]
    messages = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_b", "content": "off"},
                {"role": "tool", "tool_call_id": "call_a", "content": "on"},
                {"role": "tool", "name": "HassTurnOn", "tool_call_id": "call_x", "content": "x"}]
    got = tool_request(messages, TOOLS, "auto", None).messages
    results = [m["content"] for m in got if m["role"] == "user"][-3:]
    assert results[0].endswith("Result of HassTurnOff: off")
    assert results[1] == "Result of HassTurnOn: on"
    assert results[2].endswith("Result of HassTurnOn: x")
