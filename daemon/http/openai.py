"""OpenAI-compatible endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions`` (plain JSON, or SSE chunks ending in ``data: [DONE]``).

Generation runs in llama-cpp-python inside a worker thread while holding the model's device
slot, so requests to one device are serialised and a full queue answers 503. ``usage`` also
carries ``energy_j`` (the board energy attributed to the request, see
:meth:`edgepilot.telemetry.work.WorkMeter.end`) and ``joules_per_token`` (per completion token),
both null without a power sensor; clients that do not know them ignore them. Usage counts are
llama.cpp's own: for streams (``stream_options.include_usage``) the backend's
:class:`~edgepilot.backends.llamacpp.TokenStream` counts the sampled tokens with the rule of the
non-streamed response (an end-of-generation token is not counted, a token completing a ``stop``
string is), so both equal what llama-cpp-python reports.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from edgepilot.commands import error_body
from edgepilot.errors import CommandError
from edgepilot.serving.registry import LoadedModel, ModelRegistry
from edgepilot.telemetry.work import Request as WorkRequest

router = APIRouter()


def _utf8(text: str) -> str:
    # JSON may carry lone surrogates ("\ud800") that no tokenizer can encode; refuse them here,
    # naming the field, instead of failing inside llama.cpp
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text must be valid Unicode; a lone surrogate "
                         f"{text[exc.start]!r} is at position {exc.start}") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: Text


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: str | None = Field(None, max_length=256)

    def as_llama(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class StreamOptions(_Strict):
    include_usage: bool = False


class Sampling(_Strict):
    model: str = Field(min_length=1, max_length=128, description="A model from /v1/models.")
    max_tokens: int | None = Field(None, ge=1, le=1 << 20)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: Text | list[Text] | None = Field(None, description="Up to 4 stop strings.")
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    n: Literal[1] = Field(1, description="Only one choice per request is generated.")
    user: str | None = Field(None, max_length=256)

    def llama_params(self) -> dict[str, Any]:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stop) > 4:
            raise CommandError("at most 4 stop strings are allowed", field="stop")
        params: dict[str, Any] = {
            "temperature": self.temperature, "top_p": self.top_p, "stop": stop,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty}
        if self.max_tokens is not None:
            params["max_tokens"] = self.max_tokens
        if self.seed is not None:
            params["seed"] = self.seed
        return params


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=1 << 20)


class CompletionRequest(Sampling):
    prompt: Text | list[Text]


async def _acquire_llm(request: Request, name: str) -> tuple[ModelRegistry, LoadedModel]:
    registry: ModelRegistry = request.app.state.daemon.models
    model = registry.resolve(name)
    if model.kind != "gguf":
        raise CommandError(f"model {name!r} is a {model.kind} tensor model; send tensors to "
                           f"POST /v1/infer/{name}", field="model")
    return registry, await registry.acquire(name)


@router.get("/v1/models", summary="Models this daemon can serve (OpenAI list shape)")
async def list_models(request: Request) -> dict[str, Any]:
    registry: ModelRegistry = request.app.state.daemon.models
    data = [{"id": m["name"], "object": "model", "created": int(request.app.state.daemon
                                                              .started_at),
             "owned_by": "edgepilot", "kind": m.get("kind"), "loaded": m["loaded"]}
            for m in registry.listing()]
    return {"object": "list", "data": data}


@router.post("/v1/chat/completions", summary="OpenAI chat completion (GGUF models)")
async def chat_completions(req: ChatRequest, request: Request) -> Any:
    params = req.llama_params()
    if req.max_completion_tokens is not None:
        params["max_tokens"] = req.max_completion_tokens
    messages = [m.as_llama() for m in req.messages]
    registry, lm = await _acquire_llm(request, req.model)
    call = functools.partial(lm.executable.chat, messages)  # type: ignore[attr-defined]
    return await _serve(request, registry, lm, req, call, params)


@router.post("/v1/completions", summary="OpenAI text completion (GGUF models)")
async def completions(req: CompletionRequest, request: Request) -> Any:
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise CommandError("exactly one prompt per request is supported", field="prompt")
        prompt = prompt[0]
    params = req.llama_params()
    registry, lm = await _acquire_llm(request, req.model)
    call = functools.partial(lm.executable.complete, prompt)  # type: ignore[attr-defined]
    return await _serve(request, registry, lm, req, call, params)


def energy_usage(energy_j: float | None, completion_tokens: int) -> dict[str, float | None]:
    """The energy fields of ``usage``: null when unknown (no power sensor), never 0."""
    per_token = energy_j / completion_tokens if energy_j is not None and completion_tokens else None
    return {"energy_j": energy_j, "joules_per_token": per_token}


async def _serve(request: Request, registry: ModelRegistry, lm: LoadedModel, req: Sampling,
                 call: Callable[..., Any], params: dict[str, Any]) -> Any:
    daemon = request.app.state.daemon
    queue = registry.queue(lm.device)
    work = daemon.work.begin(req.model)  # busy (for energy shares) until ended, whatever happens
    if not req.stream:
        cancel = threading.Event()
        try:
            async with queue.slot():
                result = await asyncio.get_running_loop().run_in_executor(
                    _executor(daemon, lm), functools.partial(call, cancel=cancel, **params))
        except BaseException:
            daemon.work.end(work, ok=False)
            raise
        finally:
            cancel.set()  # cancelled (client gone, shutdown): the worker stops at its next token
            registry.release(lm)
        result["model"] = req.model
        usage = result.get("usage")
        completion = int(usage.get("completion_tokens", 0)) if isinstance(usage, dict) else 0
        energy = daemon.work.end(work, tokens=completion)
        if isinstance(usage, dict):
            usage.update(energy_usage(energy, completion))
        return JSONResponse(result)
    try:
        await queue.acquire()  # a full queue is a 503 before any byte is streamed
    except BaseException:
        registry.release(lm)
        daemon.work.end(work, ok=False)
        raise
    worker = _Worker(daemon, registry, lm, call, params)
    try:
        # wait for the first token: a request llama.cpp refuses (a prompt over the context,
        # an option the model was not loaded for) is then a proper HTTP error, not a 200
        # followed by an error event
        first = await worker.items.get()
    except BaseException:
        worker.finish()
        daemon.work.end(work, ok=False)
        raise
    if first[0] == "error":
        worker.finish()
        daemon.work.end(work, ok=False)
        raise first[1]
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    body = _stream(daemon, worker, first, req.model, include_usage, work)
    # a body that is never iterated (the client left before it started) runs no finally:
    # the request still stops counting as busy when the body is dropped (no-op once ended)
    weakref.finalize(body, daemon.work.end, work, ok=False)
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _executor(daemon: Any, lm: LoadedModel) -> concurrent.futures.Executor:
    """Where a generation runs: the model's own thread when it has one (llama.cpp runs every
    computation on one thread, see ``LlamaThread``: a hand-over per token would cost), else the
    daemon's worker pool."""
    own = getattr(lm.executable, "executor", None)
    return own if isinstance(own, concurrent.futures.Executor) else daemon.executor  # type: ignore[no-any-return]


class _Worker:
    """One streamed generation in a worker thread, handing chunks to the loop."""

    def __init__(self, daemon: Any, registry: ModelRegistry, lm: LoadedModel,
                 call: Callable[..., Any], params: dict[str, Any]) -> None:
        self.registry, self.lm = registry, lm
        loop = asyncio.get_running_loop()
        self.items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.stop = threading.Event()
        items, stop = self.items, self.stop

        def work() -> None:
            try:
                chunks = call(**params, stream=True, cancel=stop)
                with contextlib.closing(iter(chunks)) as it:
                    for chunk in it:
                        loop.call_soon_threadsafe(items.put_nowait, ("chunk", chunk))
                        if stop.is_set():  # the client went away; closing ends generation
                            break
                loop.call_soon_threadsafe(items.put_nowait, ("end", chunks.usage))
            except Exception as exc:
                loop.call_soon_threadsafe(items.put_nowait, ("error", exc))

        self.fut = loop.run_in_executor(_executor(daemon, lm), work)
        # the device is freed when the worker leaves the runtime, whatever happens to the
        # response (even one whose body is never iterated because the client left first)
        self.fut.add_done_callback(self._release)

    def _release(self, _: Any) -> None:
        self.registry.queue(self.lm.device).release()
        self.registry.release(self.lm)

    def finish(self) -> None:
        """Stop generating at the next token (the device is freed once the worker is out)."""
        self.stop.set()


async def _stream(daemon: Any, worker: _Worker, first: tuple[str, Any], name: str,
                  include_usage: bool, work: WorkRequest) -> AsyncIterator[str]:
    last: dict[str, Any] = {}
    usage: dict[str, int] | None = None
    ok = False
    kind, item = first
    try:
        while True:
            if kind == "chunk":
                item["model"] = name
                last = item
                yield f"data: {json.dumps(item)}\n\n"
            elif kind == "error":
                yield f"data: {json.dumps({'error': error_body(item)})}\n\n"
                break
            else:
                ok, usage = True, item
                break
            kind, item = await worker.items.get()
        completion = usage["completion_tokens"] if usage else 0
        # ended before the tail is sent: its energy goes into the final usage chunk
        energy = daemon.work.end(work, tokens=completion, ok=ok)
        if ok and include_usage and usage is not None:
            tail: dict[str, Any] = {"id": last.get("id"), "object": last.get("object"),
                    "created": last.get("created"), "model": name, "choices": [],
                    "usage": {**usage, **energy_usage(energy, completion)}}
            yield f"data: {json.dumps(tail)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        daemon.work.end(work, ok=False)  # the client left mid-stream (no-op once ended)
        worker.finish()
