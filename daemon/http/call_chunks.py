"""A streamed chat under a tools grammar, sent as OpenAI streams tool calls.

A call's first chunk carries its ``id``, ``type`` and name (once the model has written its name
and the ``"arguments"`` key); its arguments follow as they are generated. A client therefore
sees a call begin within a few tokens (a progress bar, an agent framework's partial arguments)
rather than after the whole call, which on a board generating 5-10 tokens a second took
seconds of silence. Later calls of a list are sent whole as each one ends, a repeat of an
earlier call left out (as the whole answer leaves it out). An answer that is no call (text, or
JSON answering a schema under ``auto``) is sent as content. The chunks add up to the whole
answer: the same calls, arguments, finish reason and logprobs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from edgepilot.serving.call_stream import OpenCall, answer_kind, calls_so_far
from edgepilot.serving.generate import StreamEnd
from edgepilot.serving.tools import ToolRequest, cut_call


class _Calls:
    """What of the answer has been sent: its text so far, the calls announced, the logprobs
    not yet carried by a chunk."""

    def __init__(self, tools: ToolRequest) -> None:
        self.tools, self.text = tools, ""
        self.kind: str | None = None  # "call", "text", or None while it may be either
        self.first: str | None = None  # the first call's arguments sent (None: not opened)
        self.keys: list[str] = []  # the calls sent, each once whole: a repeat is not sent
        self.read = 1  # the calls read so far (the first from its opening)
        self.logprobs: list[Any] = []
        self.role_sent = False

    def deltas(self) -> list[dict[str, Any]]:
        """The ``tool_calls`` deltas the text read so far adds."""
        out: list[dict[str, Any]] = []
        calls = calls_so_far(self.text, self.tools.names)
        if not calls:
            return out
        first = calls[0]
        if self.first is None:
            self.first = ""
            out.append(_opening(0, first.name))
        if len(first.arguments) > len(self.first):
            out.append({"index": 0, "function": {
                "arguments": first.arguments[len(self.first):]}})
            self.first = first.arguments
        if first.complete and not self.keys:
            self.keys.append(_key(first))
        for call in calls[self.read:]:  # later calls, each whole once it ends
            if not call.complete:
                break
            self.read += 1
            if (key := _key(call)) not in self.keys:
                out.append({**_opening(len(self.keys), call.name), "function": {
                    "name": call.name, "arguments": call.arguments}})
                self.keys.append(key)
        return out


def _opening(index: int, name: str) -> dict[str, Any]:
    return {"index": index, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": ""}}


def _key(call: OpenCall) -> str:
    try:
        return json.dumps([call.name, json.loads(call.arguments)], sort_keys=True)
    except json.JSONDecodeError:
        return json.dumps([call.name, call.arguments])


async def streamed_calls(items: AsyncGenerator[Any, None], tools: ToolRequest
                         ) -> AsyncGenerator[Any, None]:
    """The backend's stream of chat chunks (ending with a :class:`StreamEnd`), its content
    rewritten as ``tool_calls`` deltas where it is a call."""
    state = _Calls(tools)
    held = ""  # content not sent while the answer may still be a call
    try:
        async for item in items:
            if isinstance(item, (StreamEnd, BaseException)) or not item.get("choices"):
                yield item
                continue
            choice = item["choices"][0]
            delta = dict(choice.get("delta") or {})
            piece = delta.pop("content", None) or ""
            state.logprobs += (choice.get("logprobs") or {}).get("content") or []
            finish = choice.get("finish_reason")
            if state.kind == "text":
                delta["content"] = piece
            elif piece:
                state.text += piece
                held += piece
                if state.kind is None:  # decided once, not read again at every token
                    state.kind = answer_kind(state.text, tools.names)
                if state.kind == "text":
                    delta["content"], held = held, ""
                elif state.kind == "call" and (calls := state.deltas()):
                    delta["tool_calls"], held = calls, ""
            if finish is not None:
                finish = _finish(state, finish, delta, held)
            elif not delta.get("content") and not delta.get("tool_calls") \
                    and "role" not in delta:
                continue  # nothing to send yet: its logprobs ride on the next chunk
            logprobs, state.logprobs = state.logprobs, []
            if not state.role_sent:
                delta, state.role_sent = {"role": "assistant", **delta}, True
            yield {**item, "choices": [{**choice, "delta": delta, "finish_reason": finish,
                                        "logprobs": {"content": logprobs} if logprobs
                                        else choice.get("logprobs")}]}
    finally:
        await items.aclose()


def _finish(state: _Calls, finish: str, delta: dict[str, Any], held: str) -> str:
    """The last chunk: the finish reason of the whole answer (``tool_calls`` for calls; a call
    cut by ``max_tokens`` keeps ``length``), and anything held that was no call, as content."""
    if state.kind == "call" and state.first is not None:
        return "tool_calls" if state.tools.parse(state.text) else finish
    if state.kind is None and finish == "length" \
            and (cut := cut_call(state.text, state.tools.names)) is not None:
        delta["tool_calls"] = [{"index": 0, **cut}]  # cut before its arguments began
        return finish
    if held:
        delta["content"] = held
    return finish
