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
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from edgepilot.command_registry import error_body
from edgepilot.errors import CommandError, EdgepilotError, NotFoundError
from edgepilot.http.api import api_of
from edgepilot.http.client_gone import unless_client_leaves
from edgepilot.http.openai_tools import (
    check_messages,
    completion_logprobs,
    logprob_params,
    response_format_params,
    tool_choice_needs_tools,
    whole_as_chunks,
    with_tool_calls,
)
from edgepilot.serving.generate import Generator, StreamEnd
from edgepilot.serving.templates import template_of
from edgepilot.serving.tools import chat_template_of, tool_request

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


class CallFunction(_Strict):
    name: str = Field(min_length=1, max_length=256)
    arguments: str = Field(max_length=1 << 20, description="The arguments as a JSON string.")


class ToolCall(_Strict):
    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: CallFunction


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: str | None = Field(None, max_length=256)
    tool_calls: list[ToolCall] | None = Field(None, max_length=128,
                                              description="An assistant's earlier calls.")
    tool_call_id: str | None = Field(None, max_length=256,
                                     description="The call a tool message answers.")
    # an agent loop sends an answer's message back whole (``message.model_dump()``)
    refusal: str | None = Field(None, max_length=1 << 16, description="Accepted and ignored.")
    annotations: list[Any] | None = Field(None, max_length=0, description="Accepted empty.")
    audio: None = Field(None, description="Accepted as null (no audio).")
    function_call: None = Field(None, description="Accepted as null (see tool_calls).")

    def as_llama(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": content or ""}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and role == "tool":
            out["name"] = self.name
        return out


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str | None = Field(None, max_length=1 << 16)
    parameters: dict[str, Any] | None = Field(None, description="JSON Schema of the arguments.")
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str = Field(min_length=1, max_length=256)


class ToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = Field(None, description="Accepted and ignored.")


# sampling fields a client may send as null for "the default"
_NULLABLE = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "n", "stream",
             "logit_bias")


def _no_token_ids(value: Any) -> Any:
    """Token ids are a tokenizer's: OpenAI clients that send them (LangChain's
    OpenAIEmbeddings counts with tiktoken) mean OpenAI's, which are not this model's."""
    if isinstance(value, list) and value and not all(isinstance(v, str) for v in value):
        raise ValueError("token ids are not supported: ids are tokenizer-specific (a client "
                         "counting with tiktoken sends OpenAI's, not this model's); send text "
                         "(LangChain: OpenAIEmbeddings(check_embedding_ctx_length=False))")
    return value


# text, or what an OpenAI client may send instead: token ids, refused naming the field
Texts = Annotated[Text | list[Text] | list[int] | list[list[int]], AfterValidator(_no_token_ids)]


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
    adapter: str | None = Field(
        None, min_length=1, max_length=64,
        description="A LoRA adapter of the model (its [[models]] adapters); the model name "
                    "'<model>:<adapter>' picks one too.")
    logit_bias: dict[str, float] | None = Field(
        None, max_length=1024, description="Token id (this model's tokenizer, as a string) -> "
                                           "bias in [-100, 100] added to its logit.")
    # fields of OpenAI's request that change nothing a local model generates (where an answer
    # is stored, billing tiers, cache routing, a reasoning model's budget): clients and
    # frameworks forward them from their settings, so they are accepted and ignored, as
    # llama.cpp's server and Ollama's /v1 do
    store: bool | None = Field(None, description="Accepted and ignored (nothing is stored).")
    metadata: dict[str, str] | None = Field(None, description="Accepted and ignored.")
    service_tier: str | None = Field(None, max_length=64, description="Accepted and ignored.")
    prompt_cache_key: str | None = Field(None, max_length=1024,
                                         description="Accepted and ignored (prefix reuse is "
                                                     "automatic).")
    safety_identifier: str | None = Field(None, max_length=256,
                                          description="Accepted and ignored.")
    reasoning_effort: str | None = Field(None, max_length=32,
                                         description="Accepted and ignored.")
    verbosity: str | None = Field(None, max_length=32, description="Accepted and ignored.")
    user: str | None = Field(None, max_length=256, description="Accepted and ignored.")

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if not (v is None and k in _NULLABLE)}
        return data

    def llama_params(self) -> dict[str, Any]:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stop) > 4:
            raise CommandError("at most 4 stop strings are allowed", field="stop")
        params: dict[str, Any] = {
            "temperature": self.temperature, "top_p": self.top_p, "stop": stop,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty}
        # absent: until end-of-sequence or a full context, as OpenAI (llama-cpp-python's own
        # default, 16 tokens, cut every answer of a client that sends no limit: LangChain's)
        params["max_tokens"] = self.max_tokens
        if self.seed is not None:
            params["seed"] = self.seed
        if self.adapter is not None:
            params["adapter"] = self.adapter
        if self.logit_bias:
            params["logit_bias"] = dict(self.logit_bias)
        return params


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=1 << 20)
    response_format: dict[str, Any] | None = Field(
        None, description='{"type": "text" | "json_object" | "json_schema", "json_schema": '
                          '{"name", "schema"}}: constrained by a grammar from the schema.')
    tools: list[ToolDef] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | ToolChoice | None = None
    parallel_tool_calls: bool | None = Field(None, description="At most one call is made.")
    logprobs: bool | None = Field(None, description="Each answer token's logprob.")
    top_logprobs: int | None = Field(None, ge=0, le=20,
                                     description="Alternatives per token (needs logprobs).")
    modalities: list[Literal["text"]] | None = Field(None, description="Text only.")


class CompletionRequest(Sampling):
    prompt: Texts
    logprobs: int | None = Field(None, ge=0, le=5, description="Each answer token's logprob "
                                 "and this many alternatives.")


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
             **({"chat_template": templates[m["name"]]} if m["name"] in templates else {})}
            for m in listing]
    return {"object": "list", "data": data}


@router.get("/v1/models/{model:path}", summary="One model this daemon can serve (OpenAI shape)")
async def get_model(model: str, request: Request) -> dict[str, Any]:
    listing = await list_models(request)
    for item in listing["data"]:
        if item["id"] == model:
            return dict(item)
    raise NotFoundError(f"model {model!r} is not served here; known: "
                        f"{', '.join(m['id'] for m in listing['data']) or 'none'}",
                        field="model")


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
    params = req.llama_params()
    if req.max_completion_tokens is not None:
        params["max_tokens"] = req.max_completion_tokens
    check_messages([m.model_dump() for m in req.messages])
    tool_choice_needs_tools(req.tools, req.tool_choice)
    params.update(logprob_params(req.logprobs, req.top_logprobs))
    messages = [m.as_llama() for m in req.messages]
    params.update(response_format_params(req.response_format))
    if req.tools and req.tool_choice != "none":
        gen = _generator(request)
        template = await asyncio.get_running_loop().run_in_executor(
            gen.executor, chat_template_of, gen.registry,
            gen.adapter_in_name(req.model, {})[0])
        choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, ToolChoice) \
            else req.tool_choice
        tools = tool_request(messages, [t.model_dump(exclude_none=True) for t in req.tools],
                             choice, template)
        params.update(tools.params)
        result = await gen.generate(req.model, "chat", tools.messages, params)
        assert isinstance(result, dict)
        result["model"] = req.model
        result = with_tool_calls(result, tools)
        if not req.stream:
            return JSONResponse(result)
        include = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(whole_as_chunks(result, include),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await _answer(request, req, "chat", messages, params)


@router.post("/v1/completions", summary="OpenAI text completion (GGUF models)")
async def completions(req: CompletionRequest, request: Request) -> Any:
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise CommandError(f"prompt holds {len(prompt)} prompts; exactly one per request "
                               "is supported", field="prompt")
        prompt = str(prompt[0])
    params = {**req.llama_params(), **logprob_params(req.logprobs, None)}
    return await _answer(request, req, "complete", prompt, params,
                         completion_shape="logprobs_top" in params)


async def _answer(request: Request, req: Sampling, kind: Literal["chat", "complete"],
                  prompt: Any, params: dict[str, Any], completion_shape: bool = False) -> Any:
    """``completion_shape``: the answer's logprobs (the backend gives the chat shape) as
    ``/v1/completions`` answers them."""
    work = _generator(request).generate(req.model, kind, prompt, params, stream=req.stream)
    result = await (work if req.stream else unless_client_leaves(request, work))
    if isinstance(result, Response):  # the client left: nobody reads this
        return result
    if isinstance(result, dict):
        result["model"] = req.model
        if completion_shape:
            _completion_logprobs(result)
        return JSONResponse(result)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return StreamingResponse(_sse(result, req.model, include_usage, completion_shape),
                             media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


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


class EmbeddingRequest(_Strict):
    model: str = Field(min_length=1, max_length=128, description="A model from /v1/models.")
    input: Texts = Field(
        description="A text or up to 256 texts (token ids are refused: they are tokenizer-"
                    "specific).")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: the little-endian float32 bytes, base64-encoded.")
    dimensions: int | None = Field(None, ge=1, description="Keep the first N dimensions.")
    user: str | None = Field(None, max_length=256)


@router.post("/v1/embeddings", summary="OpenAI embeddings (GGUF models, L2-normalised)")
async def embeddings(req: EmbeddingRequest, request: Request) -> Any:
    texts = [req.input] if isinstance(req.input, str) else [str(t) for t in req.input]
    if not 1 <= len(texts) <= 256:
        raise CommandError(f"input has {len(texts)} texts; allowed 1..256", field="input")
    vectors, tokens = await _generator(request).embed(req.model, texts)
    if req.dimensions is not None:
        vectors = [v[:req.dimensions] for v in vectors]
    return {"object": "list", "model": req.model,
            "data": [{"object": "embedding", "index": i,
                      "embedding": v if req.encoding_format == "float" else base64.b64encode(
                          np.asarray(v, dtype="<f4").tobytes()).decode("ascii")}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
