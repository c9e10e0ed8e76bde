"""OpenAI's Responses API, stateless: ``POST /v1/responses`` (GGUF models).

Clients built on it (the OpenAI Agents SDK, ``client.responses.create``, agents that moved off
chat completions) find the same answers as ``/v1/chat/completions`` gives: the request is
translated into a chat request (:mod:`edgepilot.http.responses_models`), answered by
:func:`edgepilot.http.openai.chat_completions` (its grammars, tool calls, streaming and
queueing), and the answer translated back: a ``response`` object whose ``output`` holds a
``message`` item (``output_text``) and ``function_call`` items, or, streamed, the Responses
events (``response.created`` ... ``response.output_text.delta`` ...
``response.completed``; ``response.incomplete`` when ``max_output_tokens`` cut it,
``error`` then ``response.failed`` when generation failed mid-stream).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from edgepilot.errors import CommandError
from edgepilot.http.openai import chat_completions
from edgepilot.http.openai_models import ChatRequest
from edgepilot.http.responses_models import ResponsesRequest

router = APIRouter()

# a chat request's field names as this request's own (an error names what the client sent)
_RENAMES = ((re.compile(r"^messages(\.\d+)?"), "input"),
            (re.compile(r"^response_format\.json_schema\.schema"), "text.format.schema"),
            (re.compile(r"^response_format"), "text.format"),
            (re.compile(r"^tools\.(\d+)\.function"), r"tools.\1"),
            (re.compile(r"^max_tokens"), "max_output_tokens"))


def renamed(field: str | None) -> str | None:
    """A field of the chat request (``messages.2.content``) as the Responses request names it."""
    if field is None:
        return None
    for pattern, name in _RENAMES:
        field = pattern.sub(name, field)
    return field


@router.post("/v1/responses", summary="OpenAI Responses API, stateless (GGUF models)")
async def create_response(req: ResponsesRequest, request: Request) -> Any:
    chat = _chat_request(req)
    try:
        answer = await chat_completions(chat, request)
    except CommandError as exc:
        exc.field = renamed(exc.field)
        raise
    shell = _shell(req)
    if isinstance(answer, StreamingResponse):
        return StreamingResponse(events(answer.body_iterator, shell),  # type: ignore[arg-type]
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    if isinstance(answer, JSONResponse):
        return JSONResponse(finished(shell, json.loads(bytes(answer.body))))
    return answer  # the client left: nobody reads this


def _chat_request(req: ResponsesRequest) -> ChatRequest:
    try:
        return ChatRequest.model_validate(req.chat_body())
    except ValidationError as exc:
        err = exc.errors()[0]
        field = renamed(".".join(str(p) for p in err["loc"]))
        raise CommandError(f"{field}: {err['msg']}", field=field) from None


def _shell(req: ResponsesRequest) -> dict[str, Any]:
    """The response object before any output: what the request asked, echoed."""
    return {"id": f"resp_{uuid.uuid4().hex}", "object": "response",
            "created_at": int(time.time()), "status": "in_progress", "background": False,
            "error": None, "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "max_tool_calls": req.max_tool_calls,
            "model": req.model, "output": [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None, "reasoning": {"effort": None, "summary": None},
            "service_tier": "default", "store": False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
            "top_logprobs": req.top_logprobs or 0,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": req.truncation or "disabled", "usage": None, "user": req.user,
            "metadata": req.metadata or {}}


def _message(text: str, logprobs: list[dict[str, Any]], status: str = "completed"
             ) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": logprobs}]}


def _call(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"],
            "status": status}


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    extra: dict[str, Any] = {k: usage[k] for k in ("energy_j", "joules_per_token")
                             if k in usage}
    return {"input_tokens": usage.get("prompt_tokens", 0),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.get("total_tokens", 0), **extra}


def _ending(finish: str | None) -> tuple[str, dict[str, str] | None]:
    """The response's status and incomplete_details for a chat finish reason."""
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def finished(shell: dict[str, Any], chat: dict[str, Any]) -> dict[str, Any]:
    """The response object of a whole chat answer."""
    choice = chat["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    logprobs = (choice.get("logprobs") or {}).get("content") or []
    text = message.get("content") or ""
    output = [_message(text, logprobs)] if text or not calls else []
    output += [_call(c) for c in calls]
    status, details = _ending(choice.get("finish_reason"))
    return {**shell, "status": status, "incomplete_details": details, "output": output,
            "usage": _usage(chat.get("usage"))}


class _Events:
    """Responses stream events from chat chunks, numbered as they are sent."""

    def __init__(self, shell: dict[str, Any]) -> None:
        self.shell, self.seq = shell, 0
        self.output: list[dict[str, Any]] = []
        self.text: dict[str, Any] | None = None       # the message item being written
        self.calls: dict[int, dict[str, Any]] = {}    # chat tool-call index -> item
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None

    def event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(body)}\n\n"

    def open_text(self) -> list[str]:
        self.text = _message("", [], "in_progress")
        self.text["content"] = []
        self.output.append(self.text)
        at = len(self.output) - 1
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [self.event("response.output_item.added", output_index=at, item=self.text),
                self.event("response.content_part.added", item_id=self.text["id"],
                           output_index=at, content_index=0, part=part)]

    def close_text(self) -> list[str]:
        item, self.text = self.text, None
        if item is None:
            return []
        at = self.output.index(item)
        part = {"type": "output_text", "text": item.pop("_text", ""), "annotations": [],
                "logprobs": item.pop("_logprobs", [])}
        item["content"], item["status"] = [part], "completed"
        return [self.event("response.output_text.done", item_id=item["id"], output_index=at,
                           content_index=0, text=part["text"], logprobs=part["logprobs"]),
                self.event("response.content_part.done", item_id=item["id"],
                           output_index=at, content_index=0, part=part),
                self.event("response.output_item.done", output_index=at, item=item)]

    def chunk(self, chunk: dict[str, Any]) -> list[str]:
        out: list[str] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.text is None:
                    out += self.open_text()
                assert self.text is not None
                logprobs = (choice.get("logprobs") or {}).get("content") or []
                self.text["_text"] = self.text.get("_text", "") + delta["content"]
                self.text["_logprobs"] = self.text.get("_logprobs", []) + logprobs
                out.append(self.event("response.output_text.delta", item_id=self.text["id"],
                                      output_index=self.output.index(self.text),
                                      content_index=0, delta=delta["content"],
                                      logprobs=logprobs))
            for call in delta.get("tool_calls") or []:
                out += self.call_delta(call)
            self.finish = choice.get("finish_reason") or self.finish
        return out

    def call_delta(self, call: dict[str, Any]) -> list[str]:
        out = self.close_text()
        fn = call.get("function") or {}
        item = self.calls.get(call.get("index", 0))
        if item is None:
            item = _call({"id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                          "function": {"name": fn.get("name") or "", "arguments": ""}},
                         "in_progress")
            self.calls[call.get("index", 0)] = item
            self.output.append(item)
            out.append(self.event("response.output_item.added",
                                  output_index=len(self.output) - 1, item=dict(item)))
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            out.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                  output_index=self.output.index(item),
                                  delta=fn["arguments"]))
        return out

    def end(self) -> list[str]:
        out = [] if self.output else self.open_text()  # an empty answer is an empty message
        out += self.close_text()
        for item in self.calls.values():
            at = self.output.index(item)
            item["status"] = "completed"
            out += [self.event("response.function_call_arguments.done", item_id=item["id"],
                               output_index=at, name=item["name"],
                               arguments=item["arguments"]),
                    self.event("response.output_item.done", output_index=at, item=item)]
        status, details = _ending(self.finish)
        done = {**self.shell, "status": status, "incomplete_details": details,
                "output": self.output, "usage": _usage(self.usage)}
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*out, self.event(kind, response=done)]

    def failed(self, error: dict[str, Any]) -> list[str]:
        out = self.close_text()
        failed = {**self.shell, "status": "failed", "output": self.output,
                  "error": {"code": error.get("code") or "server_error",
                            "message": error.get("message") or "generation failed"}}
        return [*out, self.event("error", code=error.get("code"), message=error.get("message"),
                                 param=error.get("param")),
                self.event("response.failed", response=failed)]


async def events(chunks: AsyncIterator[str], shell: dict[str, Any]) -> AsyncIterator[str]:
    """The Responses events of a streamed chat answer (its ``data:`` chunks)."""
    state = _Events(shell)
    yield state.event("response.created", response=shell)
    yield state.event("response.in_progress", response=shell)
    try:
        async for raw in chunks:
            for line in raw.splitlines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if isinstance(chunk.get("error"), dict):
                    for text in state.failed(chunk["error"]):
                        yield text
                    return
                for text in state.chunk(chunk):
                    yield text
        for text in state.end():
            yield text
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:  # a client that left stops the generation under it
            await close()
