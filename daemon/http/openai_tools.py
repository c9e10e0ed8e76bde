"""OpenAI chat extras: ``response_format`` (JSON object / JSON schema) and ``tools`` answers.

``response_format`` becomes a llama.cpp grammar (:mod:`edgepilot.backends.llamacpp.grammar`:
the schema is checked before llama.cpp sees it; a bad one is a 400 naming
``response_format.json_schema.schema``). A chat with ``tools`` answered with calls is parsed
into ``tool_calls`` (:mod:`edgepilot.serving.tools`; a text answer under ``auto`` streams as
any chat); streamed, its calls are sent as they are generated
(:mod:`edgepilot.http.call_chunks`), and the deprecated ``functions`` answer whole as OpenAI's
chunks: the role and the call, the finish, the usage when asked for, ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from edgepilot.backends.llamacpp.grammar import ANY_OBJECT, schema_grammar
from edgepilot.errors import CommandError
from edgepilot.serving.tools import ToolRequest, cut_call

# where a response_format's JSON schema sits, as its errors name it
SCHEMA_FIELD = "response_format.json_schema.schema"


def response_format_params(fmt: dict[str, Any] | None) -> dict[str, Any]:
    """The grammar of OpenAI's ``response_format`` (``{}`` for plain text)."""
    if not fmt:
        return {}
    kind = fmt.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"grammar": schema_grammar(None, "response_format")}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise CommandError(f"{SCHEMA_FIELD} must be a JSON Schema object",
                               field=SCHEMA_FIELD)
        return {"grammar": schema_grammar(spec["schema"], SCHEMA_FIELD)}
    raise CommandError(f"response_format.type {kind!r} is not allowed; allowed \"text\", "
                       "\"json_object\", \"json_schema\"", field="response_format.type")


def response_format_schema(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    """The schema a text answer follows under ``response_format`` (None: free text); a call
    under ``tools`` is the other choice (:func:`edgepilot.serving.tools.tool_request`)."""
    kind = (fmt or {}).get("type")
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        return dict(fmt["json_schema"]["schema"])  # type: ignore[index]
    return None


def response_format_field(fmt: dict[str, Any] | None) -> str:
    """The field an error in :func:`response_format_schema`'s schema names."""
    return SCHEMA_FIELD if (fmt or {}).get("type") == "json_schema" else "response_format"


def check_messages(messages: list[dict[str, Any]]) -> None:
    """What OpenAI refuses in a conversation (CommandError naming ``messages.<i>.<field>``):
    a system/user message without content, an assistant message with neither content nor
    tool calls, a tool message without the ``tool_call_id`` of an earlier assistant call."""
    calls: set[str] = set()
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content")
        if role == "function" or m.get("function_call"):  # left once functions became tools
            raise CommandError("function messages and function_call belong to a request with "
                               "the deprecated functions; send functions, or use tools",
                               field=f"messages.{i}.role")
        if role in ("system", "developer", "user") and content is None:
            raise CommandError(f"a {role} message needs content", field=f"messages.{i}.content")
        if role == "assistant":
            if content is None and not m.get("tool_calls"):
                raise CommandError("an assistant message needs content or tool_calls",
                                   field=f"messages.{i}.content")
            calls.update(c["id"] for c in m.get("tool_calls") or [])
        elif m.get("tool_calls"):
            raise CommandError(f"only assistant messages carry tool_calls, not {role}",
                               field=f"messages.{i}.tool_calls")
        if role == "tool":
            ref = m.get("tool_call_id")
            if not ref:
                raise CommandError("a tool message needs the tool_call_id of the call it "
                                   "answers", field=f"messages.{i}.tool_call_id")
            if ref not in calls:
                raise CommandError(f"tool_call_id {ref!r} answers no tool call of an earlier "
                                   "assistant message"
                                   + (f"; allowed: {', '.join(sorted(calls))}" if calls else ""),
                                   field=f"messages.{i}.tool_call_id")
            if content is None:
                raise CommandError("a tool message needs content (the tool's result)",
                                   field=f"messages.{i}.content")
        elif m.get("tool_call_id") is not None:
            raise CommandError(f"only tool messages carry tool_call_id, not {role}",
                               field=f"messages.{i}.tool_call_id")


def tool_choice_needs_tools(tools: list[Any] | None, choice: Any) -> None:
    """OpenAI refuses a ``tool_choice`` other than "none" without ``tools``: so does this."""
    if not tools and choice not in (None, "none"):
        raise CommandError("tool_choice is only allowed when tools are given",
                           field="tool_choice")


def logprob_params(logprobs: bool | int | None, top: int | None) -> dict[str, Any]:
    """The generation parameter of OpenAI's ``logprobs`` (chat: a flag and ``top_logprobs``;
    completions: the count of alternatives): ``{"logprobs_top": n}``, or ``{}`` for none."""
    if top is not None and logprobs is not True:
        raise CommandError("top_logprobs needs logprobs: true", field="top_logprobs")
    if logprobs is None or logprobs is False:
        return {}
    return {"logprobs_top": int(top or 0) if logprobs is True else int(logprobs)}


def completion_logprobs(content: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat shape of token logprobs as ``/v1/completions`` answers them."""
    offsets, at = [], 0
    for entry in content:
        offsets.append(at)
        at += len(entry["token"])
    tops = []
    for entry in content:
        top: dict[str, float] = {}
        for alt in entry["top_logprobs"]:  # best first: tokens of one text keep the best
            top.setdefault(alt["token"], alt["logprob"])
        tops.append(top)
    return {"tokens": [e["token"] for e in content],
            "token_logprobs": [e["logprob"] for e in content],
            "top_logprobs": tops, "text_offset": offsets}


def with_tool_calls(result: dict[str, Any], tools: ToolRequest) -> dict[str, Any]:
    """A whole chat answer whose text is a tool call, rewritten as OpenAI's ``tool_calls``."""
    choice = result["choices"][0]
    message = choice["message"]
    calls = tools.parse(message.get("content") or "")
    if calls:
        message["content"] = None
        message["tool_calls"] = calls
        choice["finish_reason"] = "tool_calls"
    elif choice.get("finish_reason") == "length" and (
            cut := cut_call(message.get("content") or "", tools.names)) is not None:
        # a call cut by max_tokens is still the call, its arguments as far as they went
        # (OpenAI's answer); its JSON fragment was the answer's text
        message["content"] = None
        message["tool_calls"] = [cut]
    return result


def as_function_call(result: dict[str, Any]) -> None:
    """A tool-call answer in the deprecated ``functions`` form: ``message.function_call``
    (one call) and finish reason ``function_call``, in place."""
    choice = result["choices"][0]
    calls = choice["message"].pop("tool_calls", None)
    if calls:
        choice["message"]["function_call"] = calls[0]["function"]
        choice["finish_reason"] = "function_call"


def whole_as_chunks(result: dict[str, Any], include_usage: bool) -> AsyncIterator[str]:
    """A whole chat answer as OpenAI's SSE chunks (its logprobs on the first)."""
    head = {"id": result.get("id"), "object": "chat.completion.chunk",
            "created": result.get("created"), "model": result.get("model")}
    choice = result["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant"}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call}
                               for i, call in enumerate(message["tool_calls"])]
    elif message.get("function_call"):
        delta["function_call"] = message["function_call"]
    else:
        delta["content"] = message.get("content") or ""
    # the answer's logprobs ride on the chunk that carries its text (or calls), as the whole
    # answer has them
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None,
                                    "logprobs": choice.get("logprobs")}]},
              {**head, "choices": [{"index": 0, "delta": {},
                                    "finish_reason": choice.get("finish_reason")}]}]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": result.get("usage")})

    async def sse() -> AsyncIterator[str]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return sse()
