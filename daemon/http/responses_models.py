"""The request body of OpenAI's Responses API (``POST /v1/responses``), validated by pydantic,
and its translation into the chat request the serving layer already answers.

The Responses API is stateless here, as Ollama's and llama.cpp's server: nothing is stored, so
``previous_response_id``, ``conversation``, stored ``prompt`` templates and ``item_reference``
inputs are refused (400, naming the field and what to send instead). ``input`` items
(messages, ``function_call``, ``function_call_output``) become chat messages; function
``tools``, ``tool_choice`` and ``text.format`` become their chat counterparts. Fields that
change nothing on a local board (``store``, ``metadata``, ``reasoning``, ``truncation``...)
are accepted and ignored; an unknown field is a 400 naming it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from edgepilot.errors import CommandError
from edgepilot.http.openai_models import Text

ROLES = ("user", "system", "developer", "assistant")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
TEXT_PARTS = ("input_text", "output_text", "text")
# what ``include`` may ask for that this server gives; the rest are OpenAI-hosted outputs
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class ResponsesRequest(BaseModel):
    """``POST /v1/responses`` (stateless: see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=128, description="A model from /v1/models.")
    input: Text | list[dict[str, Any]] = Field(
        description="A text (one user message) or a list of items: messages (role, content "
        "as a text or input_text parts), function_call and function_call_output items.")
    instructions: Text | None = Field(None, description="A system message put first.")
    tools: list[dict[str, Any]] | None = Field(None, max_length=128,
                                               description="Function tools only.")
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=1 << 20)
    max_tool_calls: int | None = Field(None, ge=1, le=128,
                                       description="1: at most one call per answer.")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = Field(
        None, description=f"{LOGPROBS_INCLUDE!r} adds token logprobs; others are ignored.")
    stream: bool = False
    text: dict[str, Any] | None = Field(
        None, description="format: text, json_object or json_schema (name, schema).")
    previous_response_id: str | None = Field(None, description="Refused: nothing is stored.")
    conversation: Any = Field(None, description="Refused: nothing is stored.")
    prompt: Any = Field(None, description="Refused: no prompt templates are stored.")
    background: bool | None = Field(None, description="Refused when true.")
    image: Any = Field(None, description="Refused: these models take text only.")
    store: bool | None = Field(None, description="Accepted and ignored (nothing is stored).")
    metadata: dict[str, str] | None = Field(None, description="Accepted and ignored.")
    reasoning: dict[str, Any] | None = Field(None, description="Accepted and ignored.")
    truncation: Literal["auto", "disabled"] | None = Field(
        None, description="Accepted and ignored: a prompt over the context is a 400.")
    stream_options: dict[str, Any] | None = Field(None, description="Accepted and ignored.")
    service_tier: str | None = Field(None, max_length=64, description="Accepted and ignored.")
    user: str | None = Field(None, max_length=256, description="Accepted and ignored.")
    safety_identifier: str | None = Field(None, max_length=256,
                                          description="Accepted and ignored.")
    prompt_cache_key: str | None = Field(None, max_length=1024,
                                         description="Accepted and ignored.")
    prompt_cache_retention: str | None = Field(None, max_length=64,
                                               description="Accepted and ignored.")
    prompt_cache_options: dict[str, Any] | None = Field(None,
                                                        description="Accepted and ignored.")
    context_management: Any = Field(None, description="Accepted and ignored.")
    moderation: Any = Field(None, description="Accepted and ignored.")
    access_programs: Any = Field(None, description="Accepted and ignored.")
    background_options: Any = Field(None, description="Accepted and ignored.")

    def refused(self) -> None:
        """What a stateless server cannot do, as a 400 naming the field."""
        stored = "this server keeps no responses or conversations (stateless, as Ollama's " \
            "/v1/responses); send the whole conversation as input items"
        for name in ("previous_response_id", "conversation"):
            if getattr(self, name) is not None:
                raise CommandError(f"{name}: {stored}", field=name)
        if self.prompt is not None:
            raise CommandError("prompt: no prompt templates are stored here; send the text "
                               "as instructions and input", field="prompt")
        if self.background:
            raise CommandError("background: true needs stored responses, which this server "
                               "does not keep; send the request without it (stream it to see "
                               "progress)", field="background")
        if self.image is not None:
            raise CommandError("image: the models served here take text only", field="image")

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or []) or bool(self.top_logprobs)

    def chat_body(self) -> dict[str, Any]:
        """The ``/v1/chat/completions`` body this request is answered as (CommandError naming
        this request's own fields: ``input.3.call_id``, ``tools.0.type``...)."""
        self.refused()
        body: dict[str, Any] = {"model": self.model, "messages": self._messages()}
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        for name in ("temperature", "top_p"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.wants_logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = self.top_logprobs or 0
        if self.tools:
            body["tools"] = [_tool(t, i) for i, t in enumerate(self.tools)]
        # "auto" or "none" without tools says nothing (agent frameworks send it always)
        if self.tool_choice is not None and (self.tools or self.tool_choice not in ("auto",
                                                                                  "none")):
            body["tool_choice"] = _tool_choice(self.tool_choice)
        if self.parallel_tool_calls is not None or self.max_tool_calls == 1:
            body["parallel_tool_calls"] = bool(self.parallel_tool_calls) \
                and self.max_tool_calls != 1
        fmt = (self.text or {}).get("format")
        if fmt is not None:
            body["response_format"] = _response_format(fmt)
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def _messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.instructions is not None:
            messages.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return [*messages, {"role": "user", "content": self.input}]
        if not self.input:
            raise CommandError("input is an empty list; give a text or at least one item",
                               field="input")
        turn: dict[str, Any] | None = None  # the assistant turn function calls join
        calls: set[str] = set()
        for i, item in enumerate(self.input):
            kind = item.get("type") or "message"
            if kind == "message":
                role = item.get("role")
                if role not in ROLES:
                    raise CommandError(f"input.{i}.role {role!r} is not allowed; allowed: "
                                       + ", ".join(ROLES), field=f"input.{i}.role")
                content = _content(item.get("content"), f"input.{i}.content")
                turn = {"role": role, "content": content} if role == "assistant" else None
                messages.append(turn or {"role": role, "content": content})
            elif kind == "function_call":
                call_id, arguments = _string(item, "call_id", i), item.get("arguments") or "{}"
                if not isinstance(arguments, str):
                    raise CommandError("arguments is a JSON text (a string)",
                                       field=f"input.{i}.arguments")
                if turn is None:
                    turn = {"role": "assistant", "content": None}
                    messages.append(turn)
                turn.setdefault("tool_calls", []).append({
                    "id": call_id, "type": "function",
                    "function": {"name": _string(item, "name", i), "arguments": arguments}})
                calls.add(call_id)
            elif kind == "function_call_output":
                turn, ref = None, _string(item, "call_id", i)
                if ref not in calls:
                    raise CommandError(
                        f"call_id {ref!r} answers no earlier function_call item"
                        + (f"; allowed: {', '.join(sorted(calls))}" if calls else "")
                        + " (stateless: the call itself is sent too)", field=f"input.{i}.call_id")
                messages.append({"role": "tool", "tool_call_id": ref,
                                 "content": _output(item.get("output"), i)})
            elif kind == "reasoning":
                continue  # a reasoning model's earlier thoughts: nothing here reads them
            elif kind == "item_reference":
                raise CommandError("an item_reference needs stored responses, which this "
                                   "server does not keep; send the item itself",
                                   field=f"input.{i}.type")
            else:
                raise CommandError(f"input.{i}.type {kind!r} is not allowed here; allowed: "
                                   + ", ".join(ITEM_TYPES), field=f"input.{i}.type")
        return messages


def _string(item: dict[str, Any], key: str, i: int) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value or len(value) > 256:
        raise CommandError(f"{key} must be a non-empty string (at most 256 characters)",
                           field=f"input.{i}.{key}")
    return value


def _content(content: Any, field: str) -> str | list[dict[str, str]]:
    """A message's content as the chat API takes it: a text, or text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise CommandError("content is a text or a list of input_text parts", field=field)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind in ("input_image", "input_file", "input_audio"):
            raise CommandError(f"{kind}: the models served here take text only; send "
                               "input_text parts", field=f"{field}.{j}.type")
        else:
            raise CommandError(f"content part type {kind!r} is not allowed; allowed: "
                               + ", ".join(TEXT_PARTS) + " (each with a text)",
                               field=f"{field}.{j}.type")
    return parts


def _output(output: Any, i: int) -> str:
    """A function_call_output's output: a text, or text parts joined."""
    if isinstance(output, str):
        return output
    parts = _content(output, f"input.{i}.output")
    if isinstance(parts, str):
        return parts
    return "".join(p["text"] for p in parts)


def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    kind = tool.get("type")
    if kind != "function":
        raise CommandError(f"tools.{i}.type {kind!r}: only function tools run here (hosted "
                           "tools are OpenAI's); allowed: \"function\"", field=f"tools.{i}.type")
    extra = set(tool) - {"type", "name", "description", "parameters", "strict"}
    if extra:
        raise CommandError(f"tools.{i} has unknown field {sorted(extra)[0]!r}; allowed: name, "
                           "description, parameters, strict", field=f"tools.{i}.{sorted(extra)[0]}")
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict")
          if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if choice.get("type") == "allowed_tools" and choice.get("mode") in ("auto", "required"):
        return str(choice["mode"])  # every tool given is allowed: the tools list is the limit
    raise CommandError("tool_choice is \"none\", \"auto\", \"required\" or "
                       "{\"type\": \"function\", \"name\": ...}", field="tool_choice")


def _response_format(fmt: Any) -> dict[str, Any]:
    """``text.format`` as the chat API's ``response_format``."""
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise CommandError("text.format.schema must be a JSON Schema object",
                               field="text.format.schema")
        return {"type": "json_schema", "json_schema": {
            "name": fmt.get("name") or "answer", "schema": fmt["schema"],
            **({"strict": fmt["strict"]} if fmt.get("strict") is not None else {})}}
    raise CommandError(f"text.format.type {kind!r} is not allowed; allowed: \"text\", "
                       "\"json_object\", \"json_schema\"", field="text.format.type")
