"""Ollama's API on the daemon's port: ``/api/chat``, ``/api/generate``, ``/api/embed``,
``/api/embeddings``, ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``.

Clients that speak Ollama (home-automation conversation agents, chat UIs, RAG tools) are given
``http://HOST:PORT`` as their Ollama URL. Requests go through the same serving owner as the
OpenAI routes (:mod:`edgepilot.serving.generate`: the device's line, energy, cancellation); the
answers are Ollama's shapes, streamed as NDJSON unless ``"stream": false``. ``keep_alive``
follows Ollama (a duration, ``0`` unloads once the request is done, a negative value keeps the
model loaded); an empty prompt or message list only loads (or, with ``keep_alive: 0``, unloads)
the model. Models are files in the model dir: ``/api/pull``, ``/api/push``, ``/api/create``,
``/api/copy`` and ``/api/delete`` answer 501 saying so. Errors are Ollama's ``{"error":
"<text>"}`` (naming the field) with the daemon's ``code`` and ``field``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from edgepilot import __version__
from edgepilot.backends.base import GenerativeExecutable
from edgepilot.backends.llamacpp.grammar import ANY_OBJECT, schema_grammar
from edgepilot.errors import CommandError, ContextOverflow, NotFoundError
from edgepilot.http.api import api_of
from edgepilot.http.bodies import parse_json
from edgepilot.http.client_gone import unless_client_leaves
from edgepilot.http.embedding_shape import shortened
from edgepilot.http.ollama_models import digest_of, model_details, show_info, tag_of, tagged
from edgepilot.http.ollama_request import (
    ChatBody,
    Common,
    EmbedBody,
    EmbeddingsBody,
    GenerateBody,
    Message,
    PullBody,
    ShowBody,
    keep_alive_seconds,
    num_ctx_option,
    parse,
    sampler_params,
)
from edgepilot.http.ollama_run import (
    Run,
    apply_keep_alive,
    fit_history,
    iso_of,
    load_timed,
    ndjson,
    now_iso,
    parts,
    start,
)
from edgepilot.serving.generate import Generator
from edgepilot.serving.tools import chat_template_of, tool_request

router = APIRouter()


class ModelsAreFiles(CommandError):
    """Ollama's model management: models here are files an operator puts in the model dir."""

    code = "not_supported"
    http_status = 501


# Bodies are read here whatever their Content-Type (Ollama's own examples send JSON with
# `curl -d`, i.e. as a form) and validated by ollama_request (400 naming the field, as Ollama
# answers); OpenAPI documents each as a JSON object
BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"type": "object", "description": "Ollama's request object for this route."}}}}}


async def _json(request: Request) -> Any:
    return parse_json(await request.body() or b"{}")


def _generator(request: Request) -> Generator:
    return api_of(request).need_generator()


def model_name(gen: Generator, name: str) -> str:
    """The model ``name`` names: Ollama clients add the tag ``:latest`` to bare names."""
    entries = gen.registry.catalog.entries()
    if name not in entries and name.endswith(":latest") and name[:-7] in entries:
        return name[:-7]
    return name


def format_params(fmt: str | dict[str, Any] | None) -> dict[str, Any]:
    """Ollama's ``format``: ``"json"`` (any JSON object) or a JSON schema, as a grammar."""
    if fmt is None or fmt == "":
        return {}
    if fmt == "json":
        return {"grammar": schema_grammar(None, "format")}
    if isinstance(fmt, dict):
        return {"grammar": schema_grammar(fmt, "format")}
    raise CommandError(f"format {fmt!r} is not allowed; allowed \"json\" or a JSON schema "
                       "object", field="format")


def _no_think(think: bool | str | None) -> None:
    if think not in (None, False, ""):
        raise CommandError("think: this daemon's models have no separate thinking output; "
                           "send think false or leave it out", field="think")


def _common(gen: Generator, body: Common) -> tuple[str, float | None, dict[str, Any]]:
    """What chat and generate read alike: the model, keep_alive and the sampler's parameters
    (options and format), each checked in that order."""
    name = model_name(gen, body.model)
    keep = keep_alive_seconds(body.keep_alive)
    params = sampler_params(body.options)
    params.update(format_params(body.format))
    _no_think(body.think)
    if body.logprobs:  # top_logprobs counts only with logprobs on, as Ollama reads it
        params["logprobs_top"] = body.top_logprobs
    return name, keep, params


def _llama_message(m: Message, i: int) -> dict[str, Any]:
    if m.images:
        raise CommandError("images are not supported (the served models read text only)",
                           field=f"messages.{i}.images")
    out: dict[str, Any] = {"role": m.role, "content": m.content or ""}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": f"call_{i}_{k}", "type": "function",
             "function": {"name": c.function.name,
                          "arguments": c.function.arguments if isinstance(
                              c.function.arguments, str) else json.dumps(c.function.arguments)}}
            for k, c in enumerate(m.tool_calls)]
    if m.role == "tool" and m.tool_name:
        out["name"] = m.tool_name
    return out


async def _load_only(gen: Generator, name: str, keep: float | None, started: int,
                     key: str, num_ctx: int | None) -> JSONResponse:
    """An empty request: load the model (or unload it with keep_alive 0), Ollama's way of
    preloading from a client."""
    gen.registry.catalog.resolve(name)
    if keep == 0:
        await gen.registry.unload(name, reason="keep_alive")
        reason = "unload"
        load_ns = 0
    else:
        load_ns = await load_timed(gen, name, num_ctx)
        apply_keep_alive(gen, name, keep)
        reason = "load"
    body: Any = {"role": "assistant", "content": ""} if key == "message" else ""
    return JSONResponse({"model": name, "created_at": now_iso(), key: body, "done": True,
                         "done_reason": reason, "load_duration": load_ns,
                         "total_duration": time.perf_counter_ns() - started})


async def _answer(request: Request, gen: Generator, run_args: tuple[Any, ...], *, chat: bool,
                  stream: bool, num_ctx: int | None, field: str = "messages") -> Any:
    """Start the generation (errors before its first token raise: the app answers their
    status) and answer it streamed, or whole (an error on the way raises too)."""
    try:
        run: Run | None = await start(gen, *run_args, num_ctx=num_ctx)
    except ContextOverflow as exc:
        # a conversation: its oldest messages left out, as Ollama does (a chat front end's
        # long history); a prompt or a last message over the context: the way out, named
        run = await fit_history(gen, *run_args, num_ctx=num_ctx) if chat else None
        if run is None:
            # Ollama's clients (home-automation agents) size the context with
            # options.num_ctx: say how far it may go for this model
            limit = await gen.registry.num_ctx_limit(gen.registry.catalog.resolve(
                gen.adapter_in_name(run_args[0], {})[0]))
            raise ContextOverflow(f"{exc.message}; or send options.num_ctx (the model is "
                                  f"reloaded with that context; at most {limit.allowed} here: "
                                  f"{limit.why})", field=field) from None
    assert run is not None
    answers = parts(run, gen, chat=chat, stream=stream)
    if stream:
        return StreamingResponse(ndjson(answers), media_type="application/x-ndjson")

    async def last() -> Any:  # not streamed: the last part is the answer
        return [part async for part in answers][-1]

    whole = await unless_client_leaves(request, last())
    return whole if isinstance(whole, Response) else JSONResponse(whole)


@router.post("/api/chat", summary="Ollama chat (NDJSON stream unless stream is false)",
             openapi_extra=BODY)
async def chat(request: Request) -> Any:
    started = time.perf_counter_ns()
    body = parse(ChatBody, await _json(request))
    gen = _generator(request)
    name, keep, params = _common(gen, body)
    num_ctx = num_ctx_option(body.options)
    if not body.messages:
        return await _load_only(gen, name, keep, started, "message", num_ctx)
    messages = [_llama_message(m, i) for i, m in enumerate(body.messages)]
    tools = None
    if body.tools:
        declared = [{"type": "function", "function": t.function.model_dump(exclude_none=True)}
                    for t in body.tools]
        template = await asyncio.get_running_loop().run_in_executor(
            gen.executor, chat_template_of, gen.registry,
            gen.adapter_in_name(name, {})[0])
        # Ollama has no tool_choice: the model calls a tool or answers in text
        tools = tool_request(messages, declared, "auto", template, answer=ANY_OBJECT
                             if body.format == "json" else body.format
                             if isinstance(body.format, dict) else None, answer_field="format")
        messages = tools.messages
        params.update(tools.params)
    return await _answer(request, gen, (name, "chat", messages, params, keep, started, tools),
                         chat=True, stream=body.stream, num_ctx=num_ctx)


@router.post("/api/generate", summary="Ollama completion (NDJSON stream unless stream is false)",
             openapi_extra=BODY)
async def generate(request: Request) -> Any:
    started = time.perf_counter_ns()
    body = parse(GenerateBody, await _json(request))
    gen = _generator(request)
    name, keep, params = _common(gen, body)
    for field, value in (("suffix", body.suffix), ("template", body.template),
                         ("context", body.context), ("images", body.images)):
        if value:
            raise CommandError(f"{field} is not supported by this daemon; send the prompt "
                               "(and system) only", field=field)
    num_ctx = num_ctx_option(body.options)
    if not body.prompt:
        return await _load_only(gen, name, keep, started, "response", num_ctx)
    if body.raw:
        args: tuple[Any, ...] = (name, "complete", body.prompt, params, keep, started)
    else:  # Ollama applies the model's template to prompt and system
        messages = ([{"role": "system", "content": body.system}] if body.system else []) \
            + [{"role": "user", "content": body.prompt}]
        args = (name, "chat", messages, params, keep, started)
    return await _answer(request, gen, args, chat=False, stream=body.stream, num_ctx=num_ctx,
                         field="prompt")


async def _embed(request: Request, name: str, texts: list[str], keep: float | None,
                 truncate: bool = True) -> tuple[list[list[float]], int, int]:
    gen = _generator(request)
    load_ns = await load_timed(gen, name)
    vectors, count = await gen.embed(name, texts, truncate)
    apply_keep_alive(gen, name, keep)
    return vectors, load_ns, count


@router.post("/api/embed", summary="Ollama embeddings of one or more inputs",
             openapi_extra=BODY)
async def embed(request: Request) -> Any:
    started = time.perf_counter_ns()
    body = parse(EmbedBody, await _json(request))
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    gen = _generator(request)
    name = model_name(gen, body.model)
    if not any(texts):  # Ollama's way to load an embedding model
        load_ns = await load_timed(gen, name)
        apply_keep_alive(gen, name, keep_alive_seconds(body.keep_alive))
        return {"model": name, "embeddings": [], "load_duration": load_ns,
                "total_duration": time.perf_counter_ns() - started}
    vectors, load_ns, count = await _embed(request, name, texts,
                                           keep_alive_seconds(body.keep_alive), body.truncate)
    vectors = shortened(vectors, body.dimensions)
    return {"model": name, "embeddings": vectors, "total_duration":
            time.perf_counter_ns() - started, "load_duration": load_ns,
            "prompt_eval_count": count}


@router.post("/api/embeddings", summary="Ollama's older single-text embeddings",
             openapi_extra=BODY)
async def embeddings(request: Request) -> Any:
    body = parse(EmbeddingsBody, await _json(request))
    gen = _generator(request)
    name = model_name(gen, body.model)
    vectors, _, _ = await _embed(request, name, [body.prompt],
                                 keep_alive_seconds(body.keep_alive))
    return {"embedding": vectors[0]}


@router.api_route("/api/tags", methods=["GET", "HEAD"],
                  summary="Ollama's model list (the GGUF models of the model dir)")
async def tags(request: Request) -> Any:
    gen = _generator(request)
    loop = asyncio.get_running_loop()
    models = await loop.run_in_executor(gen.executor, lambda: [
        tag_of(gen, item) for item in gen.registry.listing() if item.get("kind") == "gguf"])
    return {"models": models}


@router.get("/api/ps", summary="Ollama's list of loaded models and when they unload")
async def ps(request: Request) -> Any:
    gen = _generator(request)
    out = []
    for name, lm in sorted(gen.registry.loaded.items()):
        if lm.model.kind != "gguf":
            continue
        exe = lm.executable
        out.append({"name": tagged(name), "model": tagged(name), "size": lm.memory_bytes,
                    "size_vram": 0,
                    "digest": digest_of(name, lm.model.path, lm.model.entry.sha256),
                    "details": model_details(lm.model.path, lm.model.kind),
                    "expires_at": iso_of(lm.expires_at()),
                    # each request's context, as options.num_ctx asks it (a model generating
                    # N sequences at once holds N of them)
                    "context_length": exe.n_ctx // max(1, exe.max_concurrency)
                    if isinstance(exe, GenerativeExecutable) else None})
    return {"models": out}


@router.post("/api/show", summary="Ollama's model details (template, architecture, context)",
             openapi_extra=BODY)
async def show(request: Request) -> Any:
    body = parse(ShowBody, await _json(request))
    gen = _generator(request)
    given = body.model or body.name
    if not given:
        raise CommandError("field 'model' is required", field="model")
    name = model_name(gen, given)
    model = gen.registry.catalog.resolve(name)
    if model.kind != "gguf":
        raise NotFoundError(f"model {name!r} is a {model.kind} tensor model, not a language "
                            "model", field="model")
    return await asyncio.get_running_loop().run_in_executor(gen.executor, show_info, gen, model)


@router.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse,
                  summary="Ollama's heartbeat: 200 and its text")
async def heartbeat() -> str:
    # the ollama CLI (OLLAMA_HOST=...) and chat front ends probe "/" before anything else
    return "Ollama is running"


# the Ollama release whose API the routes here answer as: clients gate on it (VS Code's
# Ollama provider refuses a server under 0.6.4), so it is Ollama's number, not edgepilot's
OLLAMA_API_VERSION = "0.9.0"


@router.api_route("/api/version", methods=["GET", "HEAD"],
                  summary="The Ollama API version answered here, and edgepilot's own")
async def version() -> dict[str, str]:
    return {"version": OLLAMA_API_VERSION, "edgepilot": __version__}


@router.post("/api/pull", include_in_schema=False)
async def pull(request: Request) -> Any:
    """A model already in the model dir is pulled at once (scripts and clients "ensure" a model
    by pulling it before use: Ollama answers a local one with its status lines ending in
    ``success``); any other is a 501, as nothing is downloaded on a board."""
    body = parse(PullBody, await _json(request))
    gen = _generator(request)
    given = body.model or body.name
    if not given:
        raise CommandError("field 'model' is required", field="model")
    try:
        gen.registry.catalog.resolve(model_name(gen, given))
    except NotFoundError:
        await manage(request)
    if not body.stream:
        return {"status": "success"}

    async def lines() -> Any:
        for status in ("pulling manifest", "verifying sha256 digest", "writing manifest",
                       "success"):
            yield {"status": status}

    return StreamingResponse(ndjson(lines()), media_type="application/x-ndjson")


@router.post("/api/push", include_in_schema=False)
@router.post("/api/create", include_in_schema=False)
@router.post("/api/copy", include_in_schema=False)
@router.delete("/api/delete", include_in_schema=False)
async def manage(request: Request) -> Any:
    raise ModelsAreFiles(
        f"{request.url.path}: models are files in this daemon's model dir (no downloads on a "
        "board): copy a .gguf there (or add a [[models]] entry) and it is listed by /api/tags",
        field="path")
