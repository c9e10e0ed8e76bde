"""OpenAI-compatible endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``,
``POST /v1/completions`` (plain JSON, or SSE chunks ending in ``data: [DONE]``).

Generation is the serving layer's (:mod:`edgepilot.serving.generate`): these routes parse,
call it and format the answer. A full queue answers 503. ``usage`` also
carries ``energy_j`` (the board energy attributed to the request, see
:meth:`edgepilot.telemetry.work.WorkMeter.end`) and ``joules_per_token`` (per completion token),
both null without a power sensor; clients that do not know them ignore them. Usage counts are
llama.cpp's own: for streams (``stream_options.include_usage``) the backend's
:class:`~edgepilot.backends.llamacpp.backend.TokenStream` counts the sampled tokens with the
rule of the non-streamed response (an end-of-generation token is not counted, a token
completing a ``stop`` string is), so both equal what llama-cpp-python reports.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from edgepilot.command_registry import error_body
from edgepilot.errors import CommandError, EdgepilotError, NotFoundError
from edgepilot.formats.io import tensor_specs
from edgepilot.http.api import api_of
from edgepilot.http.call_chunks import streamed_calls
from edgepilot.http.choices import chained, jobs_of, merged
from edgepilot.http.client_gone import unless_client_leaves
from edgepilot.http.embedding_shape import count_ok, shortened
from edgepilot.http.openai_models import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Sampling,
    ToolChoice,
)
from edgepilot.http.openai_tools import (
    as_function_call,
    check_messages,
    completion_logprobs,
    logprob_params,
    response_format_field,
    response_format_params,
    response_format_schema,
    tool_choice_needs_tools,
    whole_as_chunks,
    with_tool_calls,
)
from edgepilot.serving.generate import Generator, StreamEnd
from edgepilot.serving.templates import template_of
from edgepilot.serving.tools import chat_template_of, tool_request

router = APIRouter()


def _generator(request: Request) -> Generator:
    return api_of(request).need_generator()


@router.get("/v1/models", summary="Models this daemon can serve (OpenAI list shape)")
async def list_models(request: Request) -> dict[str, Any]:
    gen = _generator(request)
    created = int(api_of(request).started_at)
    listing = gen.registry.listing()
    templates = await asyncio.get_running_loop().run_in_executor(
        gen.executor, _templates, gen, [m["name"] for m in listing if m.get("kind") == "gguf"])
    data = [{"id": m["name"], "object": "model", "created": created, "owned_by": "edgepilot",
             "kind": m.get("kind"), "loaded": m["loaded"], "worker_pid": m.get("worker_pid"),
             **({"chat_template": templates[m["name"]]} if m["name"] in templates else {}),
             # why a model does not load (a missing or broken file): what a POST would say
             **({"error": m["error"]} if m.get("error") else {})}
            for m in listing]
    return {"object": "list", "data": data}


@router.get("/v1/models/{model:path}", summary="One model this daemon can serve (OpenAI shape)")
async def get_model(model: str, request: Request) -> dict[str, Any]:
    """The model's listing entry; a tensor model's also carries its ``inputs`` and
    ``outputs`` (name, dtype, shape: a dim is a number, a name, or null when open), what a
    ``/v1/infer`` body must hold."""
    listing = await list_models(request)
    for item in listing["data"]:
        if item["id"] == model:
            if item.get("kind") in ("onnx", "tflite"):
                gen = _generator(request)
                item.update(await asyncio.get_running_loop().run_in_executor(
                    gen.executor, _io_of, gen, model))
            return dict(item)
    raise NotFoundError(f"model {model!r} is not served here; known: "
                        f"{', '.join(m['id'] for m in listing['data']) or 'none'}",
                        field="model")


def _io_of(gen: Generator, name: str) -> dict[str, Any]:
    """Blocking: a tensor model's declared inputs and outputs (empty when its file is broken:
    the listing says why)."""
    try:
        model = gen.registry.catalog.resolve(name)
        ins, outs = tensor_specs(model.path, model.kind)
    except EdgepilotError:
        return {}
    return {side: [{"name": s.name, "dtype": s.dtype,
                    "shape": list(s.shape) if s.rank_known else None} for s in specs]
            for side, specs in (("inputs", ins), ("outputs", outs))}


def _templates(gen: Generator, names: list[str]) -> dict[str, dict[str, str]]:
    """Blocking: which chat template each GGUF model renders with (source and name)."""
    out = {}
    for name in names:
        try:
            model = gen.registry.catalog.resolve(name)
            out[name] = template_of(model, gen.registry.config.model_dir).describe()
        except EdgepilotError as exc:  # a broken file is listed with its error already
            out[name] = {"source": "error", "name": exc.message}
    return out


@router.post("/v1/chat/completions", summary="OpenAI chat completion (GGUF models)")
async def chat_completions(req: ChatRequest, request: Request) -> Any:
    legacy = req.legacy_as_tools()
    params = req.llama_params()
    if req.max_completion_tokens is not None:
        params["max_tokens"] = req.max_completion_tokens
    check_messages([m.model_dump() for m in req.messages])
    tool_choice_needs_tools(req.tools, req.tool_choice)
    params.update(logprob_params(req.logprobs, req.top_logprobs))
    messages = [m.as_llama() for m in req.messages]
    params.update(response_format_params(req.response_format))
    if req.tools and req.tool_choice != "none":
        if req.n > 1:
            raise CommandError(f"n={req.n} with tools: one answer per request is made when "
                               "tools are given; send n=1 (or several requests)", field="n")
        gen = _generator(request)
        template = await asyncio.get_running_loop().run_in_executor(
            gen.executor, chat_template_of, gen.registry,
            gen.adapter_in_name(req.model, {})[0])
        choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, ToolChoice) \
            else req.tool_choice
        tools = tool_request(messages, [t.model_dump(exclude_none=True) for t in req.tools],
                             choice, template,
                             parallel=not legacy and req.parallel_tool_calls is not False,
                             answer=response_format_schema(req.response_format),
                             answer_field=response_format_field(req.response_format))
        params.update(tools.params)

        async def whole(p: dict[str, Any]) -> Any:
            return await gen.generate(req.model, "chat", tools.messages, p)

        if await tools.chooses_text(whole, params):  # then streamed as any chat
            return await _answer(request, req, "chat", [tools.messages],
                                 tools.text_params(params))
        include = bool(req.stream_options and req.stream_options.include_usage)
        if req.stream and not legacy:  # each call sent as it is generated
            items = await gen.generate(req.model, "chat", tools.messages, params, stream=True)
            assert not isinstance(items, dict)
            return StreamingResponse(_sse(streamed_calls(items, tools), req.model, include),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        work = gen.generate(req.model, "chat", tools.messages, params)
        result = await unless_client_leaves(request, work)
        if isinstance(result, Response):  # the client left: nobody reads this
            return result
        assert isinstance(result, dict)
        result["model"] = req.model
        result = with_tool_calls(result, tools)
        if legacy:
            as_function_call(result)
        if not req.stream:
            return JSONResponse(result)
        return StreamingResponse(whole_as_chunks(result, include),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await _answer(request, req, "chat", [messages], params)


@router.post("/v1/completions", summary="OpenAI text completion (GGUF models)")
async def completions(req: CompletionRequest, request: Request) -> Any:
    prompts = [req.prompt] if isinstance(req.prompt, str) else [str(p) for p in req.prompt]
    if not prompts:
        raise CommandError("prompt is an empty list; give a text or a list of texts",
                           field="prompt")
    params = {**req.llama_params(), **logprob_params(req.logprobs, None)}
    return await _answer(request, req, "complete", prompts, params,
                         completion_shape="logprobs_top" in params)


async def _answer(request: Request, req: Sampling, kind: Literal["chat", "complete"],
                  prompts: list[Any], params: dict[str, Any],
                  completion_shape: bool = False) -> Any:
    """Each of ``prompts`` answered ``req.n`` times (:mod:`edgepilot.http.choices`).
    ``completion_shape``: the answer's logprobs (the backend gives the chat shape) as
    ``/v1/completions`` answers them."""
    gen, jobs = _generator(request), jobs_of(prompts, req.n, params)
    answers: list[Any] = []
    for prompt, job_params in jobs if not req.stream else jobs[:1]:
        work = gen.generate(req.model, kind, prompt, job_params, stream=req.stream)
        answer = await (work if req.stream else unless_client_leaves(request, work))
        if isinstance(answer, Response):  # the client left: nobody reads this
            return answer
        answers.append(answer)
    result = merged(answers) if not req.stream else answers[0] if len(jobs) == 1 \
        else chained(jobs, _starter(gen, req.model, kind), answers[0])
    if isinstance(result, dict):
        result["model"] = req.model
        if completion_shape:
            _completion_logprobs(result)
        return JSONResponse(result)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return StreamingResponse(_sse(result, req.model, include_usage, completion_shape),
                             media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _starter(gen: Generator, model: str, kind: Literal["chat", "complete"]
             ) -> Callable[[Any, dict[str, Any]], Awaitable[Any]]:
    return lambda prompt, params: gen.generate(model, kind, prompt, params, stream=True)


def _completion_logprobs(answer: dict[str, Any]) -> None:
    for choice in answer.get("choices") or []:
        choice["logprobs"] = completion_logprobs(
            (choice.get("logprobs") or {}).get("content") or [])


async def _sse(items: AsyncGenerator[Any, None], name: str, include_usage: bool,
               completion_shape: bool = False) -> AsyncIterator[str]:
    last: dict[str, Any] = {}
    try:
        async for item in items:
            if isinstance(item, StreamEnd):
                if item.usage is not None and include_usage:
                    tail: dict[str, Any] = {"id": last.get("id"), "object": last.get("object"),
                            "created": last.get("created"), "model": name, "choices": [],
                            "usage": {**item.usage, **item.energy}}
                    yield f"data: {json.dumps(tail)}\n\n"
                break
            if isinstance(item, BaseException):
                yield f"data: {json.dumps({'error': error_body(item)})}\n\n"
                continue
            item["model"] = name
            if completion_shape:
                _completion_logprobs(item)
            last = item
            yield f"data: {json.dumps(item)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        await items.aclose()


@router.post("/v1/embeddings", summary="OpenAI embeddings (GGUF models, L2-normalised)")
async def embeddings(req: EmbeddingRequest, request: Request) -> Any:
    texts = [req.input] if isinstance(req.input, str) else [str(t) for t in req.input]
    count_ok(len(texts))
    vectors, tokens = await _generator(request).embed(req.model, texts)
    vectors = shortened(vectors, req.dimensions)
    return {"object": "list", "model": req.model,
            "data": [{"object": "embedding", "index": i,
                      "embedding": v if req.encoding_format == "float" else base64.b64encode(
                          np.asarray(v, dtype="<f4").tobytes()).decode("ascii")}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
