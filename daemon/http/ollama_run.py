"""One Ollama generation: from the serving layer's OpenAI-shaped chunks to Ollama's parts.

Every ``/api/chat`` and ``/api/generate`` runs as a stream inside (so that the time of the
first token is known); a ``stream: false`` request gathers the parts into one answer. The
timing fields are measured here, in nanoseconds as Ollama reports them:

- ``load_duration``: loading the model for this request (0 when it was resident);
- ``prompt_eval_duration``: from asking for the generation (its place in the device's line
  included) to its first token, which is when llama.cpp has read the prompt;
- ``eval_duration``: from the first token to the last; ``total_duration``: the whole request;
- ``prompt_eval_count`` / ``eval_count``: llama.cpp's own prompt and completion token counts
  (the prompt's every token, those reused from the KV cache included: the OpenAI routes report
  those in ``usage.prompt_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from edgepilot.command_registry import error_body
from edgepilot.errors import ContextOverflow
from edgepilot.serving.generate import Generator, StreamEnd
from edgepilot.serving.tools import ToolRequest

log = logging.getLogger(__name__)

# unloads asked for by keep_alive 0, kept referenced until done
_unloads: set[asyncio.Task[bool]] = set()


def ollama_error(body: dict[str, Any]) -> dict[str, Any]:
    """The one error shape as Ollama's clients read it: ``error`` is a string (the official
    client raises it as ``ResponseError.error``), naming the field; ``code`` and ``field``
    ride along for programs that want them."""
    message = str(body.get("message") or "error")
    field_ = body.get("field")
    if field_ and str(field_) not in message:
        message = f"{field_}: {message}"
    return {"error": message, "code": body.get("code"), "field": field_}


def now_iso() -> str:
    """Ollama's ``created_at``: RFC 3339 in UTC."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


# Ollama's expiry of a model kept loaded forever (keep_alive -1): now plus the longest Go
# duration, year 2318 or so; clients showing "unloads in ..." parse a date, not null
NEVER_S = (1 << 63) / 1e9


def iso_of(epoch: float | None) -> str:
    """``expires_at`` as Ollama writes it; None (never unloaded) as Ollama's far future."""
    at = datetime.fromtimestamp(time.time() + NEVER_S if epoch is None else epoch, UTC)
    return at.isoformat().replace("+00:00", "Z")


def apply_keep_alive(gen: Generator, name: str, keep: float | None) -> None:
    """After a request: the model's keep-alive from now on is the request's (None: its
    configured one, as Ollama falls back to its default); 0 unloads it once idle."""
    lm = gen.registry.loaded.get(name)
    if lm is None:
        return
    lm.keep_alive_s = keep
    if keep == 0:
        task = asyncio.get_running_loop().create_task(
            gen.registry.unload(name, reason="keep_alive"), name=f"unload-{name}")
        _unloads.add(task)
        task.add_done_callback(_unloads.discard)


async def load_timed(gen: Generator, name: str, num_ctx: int | None = None) -> int:
    """Make ``name`` resident (with a context of ``num_ctx`` per request when given: another
    one reloads it); the nanoseconds that took (about 0 when it already was)."""
    start = time.perf_counter_ns()
    await gen.registry.load(name, num_ctx)
    return time.perf_counter_ns() - start


@dataclass
class Run:
    """One generation under way and its clock."""

    name: str
    kind: Literal["chat", "complete"]
    items: AsyncGenerator[Any, None]
    started: int  # the request arrived (perf_counter_ns)
    load_ns: int
    asked: int  # the generation was asked for
    first: int  # its first token came
    keep: float | None
    usage: dict[str, int] = field(default_factory=dict)
    finish: str = "stop"
    tools: ToolRequest | None = None  # the answer may be a tool call: parsed when whole
    base: str = ""  # the model loaded (name without its adapter)
    logprobs: bool = False  # the request asked for each answer token's logprob

    def timings(self, end: int) -> dict[str, Any]:
        return {"done_reason": self.finish,
                "total_duration": end - self.started, "load_duration": self.load_ns,
                "prompt_eval_count": self.usage.get("prompt_tokens", 0),
                "prompt_eval_duration": self.first - self.asked,
                "eval_count": self.usage.get("completion_tokens", 0),
                "eval_duration": end - self.first}


def without_oldest(messages: list[dict[str, Any]], drop: int) -> list[dict[str, Any]] | None:
    """``messages`` less the ``drop`` oldest that are neither system messages nor the last
    one; None when fewer than ``drop`` may go."""
    movable = [i for i, m in enumerate(messages[:-1]) if m.get("role") != "system"]
    if drop > len(movable):
        return None
    gone = set(movable[:drop])
    return [m for i, m in enumerate(messages) if i not in gone]


async def fit_history(gen: Generator, name: str, kind: Literal["chat", "complete"],
                      messages: list[dict[str, Any]], *rest: Any,
                      num_ctx: int | None = None) -> Run | None:
    """Ollama's way with a conversation longer than the context: its oldest messages are
    left out, the system messages and the last one kept, as few as make it fit; the run
    started on what fits (None: not even the last message with the system's does)."""
    for drop in range(1, len(messages)):
        shorter = without_oldest(messages, drop)
        if shorter is None:
            return None
        try:
            run = await start(gen, name, kind, shorter, *rest, num_ctx=num_ctx)
        except ContextOverflow:
            continue
        log.info("model %s: the conversation's %d oldest messages left out to fit the context",
                 name, drop)
        return run
    return None


async def start(gen: Generator, name: str, kind: Literal["chat", "complete"], prompt: Any,
                params: dict[str, Any], keep: float | None, started: int,
                tools: ToolRequest | None = None, *, num_ctx: int | None = None) -> Run:
    """Load ``name`` (with ``num_ctx``, Ollama's ``options.num_ctx``) and start its
    generation; errors before the first token raise here (a proper HTTP error, not a stream
    that fails)."""
    base = gen.adapter_in_name(name, dict(params))[0]  # "model:adapter" loads the model
    load_ns = await load_timed(gen, base, num_ctx)
    asked = time.perf_counter_ns()
    if tools is not None:  # a call or text: one token tells, and text streams (tools.py)

        async def whole(p: dict[str, Any]) -> Any:
            return await gen.generate(name, kind, prompt, p)

        if await tools.chooses_text(whole, params):
            params, tools = tools.text_params(params), None
    items = await gen.generate(name, kind, prompt, params, stream=True)
    assert not isinstance(items, dict)
    return Run(name, kind, items, started, load_ns, asked, time.perf_counter_ns(), keep,
               tools=tools if tools is not None and tools.active else None, base=base,
               logprobs="logprobs_top" in params)


def _tool_calls(deltas: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    calls = []
    for _, call in sorted(deltas.items()):
        text = call.get("arguments") or "{}"
        try:
            arguments = json.loads(text)
        except json.JSONDecodeError:
            arguments = {"_raw": text}  # never expected: the grammar writes JSON
        calls.append({"function": {"name": call.get("name", ""), "arguments": arguments}})
    return calls


async def events(run: Run) -> AsyncIterator[tuple[str, Any]]:
    """``("text", str)``, ``("tool_calls", list)``, ``("logprobs", list)`` (the entries of the
    tokens of the text that follows: OpenAI's chat shape is Ollama's), ``("error", exc)``; the
    run's usage and finish reason are set when they end."""
    calls: dict[int, dict[str, Any]] = {}
    held: list[str] = []  # an answer that may be a tool call is parsed whole
    try:
        async for item in run.items:
            if isinstance(item, StreamEnd):
                run.usage = item.usage or {}
                break
            if isinstance(item, BaseException):
                yield "error", item
                return
            for choice in item.get("choices") or []:
                if entries := (choice.get("logprobs") or {}).get("content"):
                    yield "logprobs", entries
                if choice.get("finish_reason"):
                    run.finish = "length" if choice["finish_reason"] == "length" else "stop"
                if run.kind == "complete":
                    text = choice.get("text")
                else:
                    delta = choice.get("delta") or {}
                    text = delta.get("content")
                    for tc in delta.get("tool_calls") or []:
                        slot = calls.setdefault(int(tc.get("index", 0)), {})
                        fn = tc.get("function") or {}
                        if fn.get("name"):
                            slot["name"] = fn["name"]
                        slot["arguments"] = slot.get("arguments", "") + (fn.get("arguments") or "")
                if text and run.tools is not None:
                    held.append(text)
                elif text:
                    yield "text", text
        if run.tools is not None:
            whole = "".join(held)
            parsed = run.tools.parse(whole)
            if parsed is None:
                yield "text", whole
            else:
                yield "tool_calls", [{"function": {
                    "name": c["function"]["name"],
                    "arguments": json.loads(c["function"]["arguments"])}} for c in parsed]
        if calls:
            yield "tool_calls", _tool_calls(calls)
    finally:
        await run.items.aclose()


async def parts(run: Run, gen: Generator, *, chat: bool, stream: bool
                ) -> AsyncIterator[dict[str, Any]]:
    """Ollama's response objects: one per text piece when streaming, then the last (done)
    one with the timings; not streaming, only the last with the whole text. An error after the
    first token of a stream is a part ``{"error": "<text>"}`` (Ollama's clients raise it); not
    streaming, it is raised (the route answers its status: 503 for a worker being restarted)."""
    key = "message" if chat else "response"

    def body(text: str, calls: list[dict[str, Any]] | None = None) -> Any:
        if not chat:
            return text
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        return message

    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    # logprob entries not yet sent: a stream sends them with the text they wrote
    logprobs: list[dict[str, Any]] = []

    def with_logprobs(part: dict[str, Any]) -> dict[str, Any]:
        if run.logprobs:
            part["logprobs"] = list(logprobs)
            if stream:
                logprobs.clear()
        return part

    try:
        async for kind, value in events(run):
            if kind == "error":
                if not stream:  # nothing is sent yet: the route answers the error's status
                    raise value
                yield ollama_error(error_body(value))
                return
            if kind == "tool_calls":
                calls = value
            elif kind == "logprobs":
                logprobs.extend(value)
            elif stream:
                yield with_logprobs({"model": run.name, "created_at": now_iso(),
                                     key: body(value), "done": False})
            else:
                texts.append(value)
    finally:
        apply_keep_alive(gen, run.base or run.name, run.keep)
    end = time.perf_counter_ns()
    last: dict[str, Any] = {"model": run.name, "created_at": now_iso(),
                            key: body("".join(texts), calls), "done": True,
                            **run.timings(end)}
    if calls and stream:
        yield with_logprobs({"model": run.name, "created_at": now_iso(), key: body("", calls),
                             "done": False})
        last[key] = body("")
    yield with_logprobs(last)


async def ndjson(items: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """Newline-delimited JSON, one object a line (Ollama's streaming format)."""
    async for item in items:
        yield (json.dumps(item) + "\n").encode()
