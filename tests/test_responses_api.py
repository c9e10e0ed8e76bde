"""OpenAI's Responses API (``/v1/responses``, stateless) with the official ``openai`` client,
unmodified, against a real daemon serving SmolLM2-135M-Instruct: text, streamed events, tool
calls and their outputs sent back, structured output parsed into a pydantic model, and what a
stateless server refuses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from daemon_proc import DaemonProcess
from models_fixtures import module_tmp, smol_daemon  # noqa: F401
from pydantic import BaseModel, Field

pytestmark = pytest.mark.timeout(900)

TOOLS: list[Any] = [{
    "type": "function", "name": "turn_on", "description": "Turns on a device",
    "parameters": {"type": "object", "required": ["name"], "additionalProperties": False,
                   "properties": {"name": {"type": "string", "maxLength": 30}}}}]


@pytest.fixture(scope="module")
def daemon(module_tmp: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    d = smol_daemon(module_tmp)
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def oa(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)


def test_text_answer_is_the_chat_answer_in_the_response_shape(oa: openai.OpenAI) -> None:
    messages: Any = [{"role": "system", "content": "Answer briefly."},
                     {"role": "user", "content": "Name a colour."}]
    chat = oa.chat.completions.create(model="smol", messages=messages, temperature=0,
                                      max_tokens=12, seed=1)
    got = oa.responses.create(model="smol", instructions="Answer briefly.",
                              input="Name a colour.", temperature=0, max_output_tokens=12)
    assert got.object == "response" and got.id.startswith("resp_")
    assert got.output[0].type == "message" and got.output[0].role == "assistant"
    assert got.output_text == chat.choices[0].message.content  # greedy, same prompt
    assert got.usage is not None and chat.usage is not None
    assert got.usage.input_tokens == chat.usage.prompt_tokens
    assert got.usage.output_tokens == chat.usage.completion_tokens
    finish = chat.choices[0].finish_reason
    assert got.status == ("incomplete" if finish == "length" else "completed")
    if finish == "length":
        assert got.incomplete_details is not None
        assert got.incomplete_details.reason == "max_output_tokens"


def test_streamed_events_build_the_same_text(oa: openai.OpenAI) -> None:
    kinds: list[str] = []
    deltas: list[str] = []
    numbers: list[int] = []
    last: Any = None
    with oa.responses.stream(model="smol", input="Count: one, two,", temperature=0,
                             max_output_tokens=16) as stream:
        for event in stream:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            last = event
    # cut by max_output_tokens, OpenAI ends with response.incomplete (the SDK's
    # get_final_response() then raises, as it does against OpenAI): the event holds it
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    final = last.response
    assert "response.output_item.added" in kinds and "response.output_text.done" in kinds
    assert numbers == list(range(len(numbers)))
    assert len(deltas) > 1 and "".join(deltas) == final.output_text
    assert final.usage is not None and 0 < final.usage.output_tokens <= 16


def test_tool_call_and_its_output_sent_back(oa: openai.OpenAI) -> None:
    got = oa.responses.create(model="smol", input="Turn on the kitchen light.", tools=TOOLS,
                              tool_choice="required", temperature=0, max_output_tokens=60)
    calls = [o for o in got.output if o.type == "function_call"]
    assert calls and got.status == "completed"
    call = calls[0]
    assert call.name == "turn_on" and call.call_id
    jsonschema.validate(json.loads(call.arguments), TOOLS[0]["parameters"])
    # the Agents SDK's next turn: the call and its output as input items
    followup: Any = [{"role": "user", "content": "Turn on the kitchen light."},
                     {"type": "function_call", "call_id": call.call_id, "name": call.name,
                      "arguments": call.arguments},
                     {"type": "function_call_output", "call_id": call.call_id,
                      "output": "done: the kitchen light is on"}]
    again = oa.responses.create(model="smol", input=followup, tools=TOOLS, tool_choice="none",
                                temperature=0, max_output_tokens=20)
    assert again.output[0].type == "message"
    chat = oa.chat.completions.create(
        model="smol", temperature=0, max_tokens=20, tool_choice="none",
        tools=[{"type": "function", "function": {k: v for k, v in TOOLS[0].items()
                                                 if k != "type"}}],
        messages=[{"role": "user", "content": "Turn on the kitchen light."},
                  {"role": "assistant", "content": None, "tool_calls": [{
                      "id": call.call_id, "type": "function",
                      "function": {"name": call.name, "arguments": call.arguments}}]},
                  {"role": "tool", "tool_call_id": call.call_id,
                   "content": "done: the kitchen light is on"}])
    assert again.output_text == (chat.choices[0].message.content or "")  # the same turn


def test_a_streamed_tool_call_arrives_as_function_call_events(oa: openai.OpenAI) -> None:
    with oa.responses.stream(model="smol", input="Turn on the heater.", tools=TOOLS,
                             tool_choice={"type": "function", "name": "turn_on"},
                             temperature=0, max_output_tokens=60) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds.count("response.function_call_arguments.delta") > 1  # as generated
    assert "response.function_call_arguments.done" in kinds
    call = next(o for o in final.output if o.type == "function_call")
    jsonschema.validate(json.loads(call.arguments), TOOLS[0]["parameters"])


class Light(BaseModel):
    room: str = Field(max_length=20)
    on: bool


def test_structured_output_parses_into_the_model(oa: openai.OpenAI) -> None:
    got = oa.responses.parse(model="smol", input="The kitchen light is on. As JSON:",
                             text_format=Light, temperature=0, max_output_tokens=60)
    assert isinstance(got.output_parsed, Light)


def test_what_a_stateless_server_refuses_names_the_field(oa: openai.OpenAI,
                                                         daemon: DaemonProcess) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]},
         "input.0.call_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input.0.content.0.type"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"frobnicate": 1}, "frobnicate"),
    ]
    for extra, field in cases:
        body = {"model": "smol", "input": "hi", **extra}
        r = httpx.post(daemon.url + "/v1/responses", json=body, timeout=60)
        assert r.status_code == 400, (extra, r.text)
        err = r.json()["error"]
        assert err["param"] == field and len(err["message"]) > 20, (extra, err)
    with pytest.raises(openai.NotFoundError):
        oa.responses.create(model="nope", input="hi")
    assert httpx.get(daemon.url + "/readyz", timeout=10).status_code == 200


def _events_of(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import asyncio

    from edgepilot.http.responses import events

    async def source() -> Any:
        for c in chunks:
            yield f"data: {json.dumps(c)}\n\n"
        yield "data: [DONE]\n\n"

    async def collect() -> list[str]:
        return [e async for e in events(source(), {"id": "resp_x", "output": []})]

    return [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(collect())]


def test_a_failure_mid_stream_ends_in_error_then_response_failed() -> None:
    got = _events_of([{"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
                      {"error": {"code": "backend_error", "message": "worker died"}}])
    kinds = [e["type"] for e in got]
    assert kinds[-2:] == ["error", "response.failed"] and "response.completed" not in kinds
    failed = got[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"] == "worker died"
    assert failed["output"][0]["content"][0]["text"] == "Hel"  # what was sent stays


def test_chat_call_chunks_become_one_function_call_item_per_call() -> None:
    calls = [{"index": 0, "id": "call_a", "function": {"name": "f", "arguments": "{\"x\":"}},
             {"index": 1, "id": "call_b", "function": {"name": "g", "arguments": "{}"}}]
    got = _events_of([{"choices": [{"index": 0, "delta": {"tool_calls": calls}}]},
                      {"choices": [{"index": 0, "delta": {"tool_calls": [
                          {"index": 0, "function": {"arguments": " 1}"}}]}}]},
                      {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
                      {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4,
                                                "total_tokens": 7}}])
    done = got[-1]["response"]
    assert got[-1]["type"] == "response.completed"
    assert [(o["call_id"], o["name"], o["arguments"]) for o in done["output"]] == \
        [("call_a", "f", "{\"x\": 1}"), ("call_b", "g", "{}")]
    assert done["usage"]["input_tokens"] == 3 and done["usage"]["output_tokens"] == 4
    assert [e["sequence_number"] for e in got] == list(range(len(got)))


def test_the_openai_agents_sdk_runs_a_tool_streams_and_parses(daemon: DaemonProcess) -> None:
    """The Agents SDK, unmodified, on its default Responses model: its tool runs on the call
    the daemon made, a streamed run ends with text, an output_type is parsed from the schema
    grammar's JSON."""
    import asyncio

    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"The weather in {city} is sunny."

    class Weather(BaseModel):
        city: str = Field(max_length=20)
        sunny: bool

    async def main() -> tuple[Any, Any, Any]:
        client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)
        model = OpenAIResponsesModel(model="smol", openai_client=client)
        tool_agent = Agent(name="w", instructions="Use the tool.", model=model,
                           tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                           model_settings=ModelSettings(tool_choice="required", temperature=0,
                                                        max_tokens=60))
        first = await Runner.run(tool_agent, "What's the weather in Paris?", max_turns=2)
        # room to end on its own: cut by max_tokens, the SDK raises on response.incomplete
        streamed = Runner.run_streamed(Agent(
            name="s", instructions="Answer briefly.", model=model,
            model_settings=ModelSettings(max_tokens=200, temperature=0)), "Say hi")
        async for _ in streamed.stream_events():
            pass
        typed = await Runner.run(Agent(name="t", instructions="Extract.", model=model,
                                       output_type=Weather, model_settings=ModelSettings(
                                           temperature=0, max_tokens=60)),
                                 "Paris is sunny today.")
        return first, streamed, typed

    first, streamed, typed = asyncio.run(main())
    assert len(ran) == 1 and first.final_output == f"The weather in {ran[0]} is sunny."
    assert isinstance(streamed.final_output, str)
    assert isinstance(typed.final_output, Weather)


def test_items_become_the_chat_conversation_they_stand_for() -> None:
    """Calls of one turn join one assistant message (after its text), outputs answer them as
    tool messages, a reasoning item is skipped, and what says nothing is not sent on."""
    from edgepilot.http.responses_models import ResponsesRequest

    req = ResponsesRequest.model_validate({
        "model": "m", "instructions": "Be brief.", "tool_choice": "auto", "max_tool_calls": 1,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Lights?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "b", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "on"},
            {"type": "function_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": "of"}, {"type": "input_text",
                                                              "text": "f"}]}]})
    body = req.chat_body()
    assert "tool_choice" not in body and "tools" not in body
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool"]
    turn = body["messages"][2]
    assert turn["content"] == [{"type": "text", "text": "Checking."}]
    assert [c["id"] for c in turn["tool_calls"]] == ["c1", "c2"]
    assert body["messages"][4]["content"] == "off"
    with_tools = ResponsesRequest.model_validate({
        "model": "m", "input": "x", "max_tool_calls": 1,
        "tools": [{"type": "function", "name": "a", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": []}}).chat_body()
    assert with_tools["tool_choice"] == "required"
    assert with_tools["parallel_tool_calls"] is False  # max_tool_calls 1: one call at most
