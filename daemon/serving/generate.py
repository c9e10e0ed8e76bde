"""The one owner of a generation (GGUF chat and text completion) for every interface.

``await generator.generate(name, kind, prompt, params, stream=...)`` resolves the model once,
takes its place (503 when the line is full), runs llama.cpp off the event loop on the model's
own thread, records work and energy, and stops at the next token when the caller goes away.

Device use: an executable that runs one request at a time holds its device (``cpu``) for the
whole generation, like any other request to that device. One that runs several sequences at
once (``[backends.llamacpp] parallel``) admits up to that many generations and holds the device
per decode step instead (its ``step_guard``), so tensor models on the same cores interleave
between tokens rather than wait for whole chats.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
import weakref
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Literal

from edgepilot.backends.base import EmbeddingsUnsupported, Executable, GenerativeExecutable
from edgepilot.errors import BusyError, CommandError, NotFoundError
from edgepilot.serving.chat_shape import chunks_as_chat, completion_as_chat
from edgepilot.serving.devices import DeviceQueue, DeviceQueues
from edgepilot.serving.registry import LoadedModel, ModelRegistry
from edgepilot.serving.templates import render, template_of
from edgepilot.serving.text_encoder import TextEncoders
from edgepilot.telemetry.work import Request as WorkRequest
from edgepilot.telemetry.work import WorkMeter

Kind = Literal["chat", "complete"]


def energy_usage(energy_j: float | None, completion_tokens: int) -> dict[str, float | None]:
    """The energy fields of ``usage``: null when unknown (no power sensor), never 0."""
    per_token = energy_j / completion_tokens if energy_j is not None and completion_tokens else None
    return {"energy_j": energy_j, "joules_per_token": per_token}


@dataclass
class StreamEnd:
    """The last item of a stream: llama.cpp's usage (None when it failed) and the energy."""

    usage: dict[str, int] | None
    energy: dict[str, float | None]


class _Admission:
    """Up to ``n`` generations inside one executable at once; at most ``max_waiting`` wait."""

    def __init__(self, name: str, n: int, max_waiting: int) -> None:
        self.name, self.n, self.max_waiting = name, n, max_waiting
        self.running = 0
        self.waiting = 0
        self._sem = asyncio.Semaphore(n)

    async def acquire(self) -> None:
        if self.running >= self.n and self.waiting >= self.max_waiting:
            raise BusyError(f"model {self.name} is running {self.running} generation(s) (its "
                            f"[backends.llamacpp] parallel) with {self.waiting} waiting (limit "
                            f"[http] max_queue = {self.max_waiting}); retry later", field="model")
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        self.running += 1

    def release(self) -> None:
        self.running -= 1
        self._sem.release()


class Generator:
    """GGUF generation for HTTP (OpenAI routes), MQTT and the CLI."""

    def __init__(self, *, registry: ModelRegistry, devices: DeviceQueues, work: WorkMeter,
                 executor: concurrent.futures.Executor, text: TextEncoders | None = None
                 ) -> None:
        """``text``: embeddings from tensor text encoders (None: GGUF models only)."""
        self.registry = registry
        self.text = text
        self.devices = devices
        self.work = work
        self.executor = executor
        self._admissions: weakref.WeakKeyDictionary[Executable, _Admission]
        self._admissions = weakref.WeakKeyDictionary()
        self._pools: weakref.WeakKeyDictionary[Executable, concurrent.futures.ThreadPoolExecutor]
        self._pools = weakref.WeakKeyDictionary()

    async def generate(self, name: str, kind: Kind, prompt: Any, params: dict[str, Any], *,
                       stream: bool = False) -> dict[str, Any] | AsyncGenerator[Any, None]:
        """A finished OpenAI response dict, or (``stream``) an async iterator of chunk dicts
        ending with a :class:`StreamEnd`; a runtime error mid-stream is yielded as the
        exception itself (the interface formats it), before the end."""
        name, params = self.adapter_in_name(name, params)
        model = self.registry.catalog.resolve(name)
        if model.kind != "gguf":
            raise CommandError(f"model {name!r} is a {model.kind} tensor model; send tensors to "
                               f"POST /v1/infer/{name}", field="model")
        as_chat = False
        if kind == "chat":
            tpl = await asyncio.get_running_loop().run_in_executor(
                self.executor, template_of, model, self.registry.config.model_dir)
            if tpl.rendered_here:  # a template llama.cpp does not have: the prompt is ours
                params = dict(params)
                prompt = render(tpl, prompt, params.pop("tools", None))
                params["stop"] = [*(params.get("stop") or []), *tpl.stop]
                kind, as_chat = "complete", True
        lm = await self.registry.acquire(name)
        exe = lm.executable
        if not isinstance(exe, GenerativeExecutable):
            self.registry.release(lm)
            raise CommandError(f"model {name!r} on {exe.target} does not generate text",
                               field="model")
        call = functools.partial(exe.chat if kind == "chat" else exe.complete, prompt)
        work = self.work.begin(name)  # busy (for energy shares) until ended, whatever happens
        try:
            release = await self._enter(lm)
        except BaseException:
            self.registry.release(lm)
            self.work.end(work, ok=False)
            raise
        if not stream:
            whole = await self._whole(lm, call, params, work, release)
            return completion_as_chat(whole) if as_chat else whole
        items = await self._stream(lm, call, params, work, release)
        return chunks_as_chat(items) if as_chat else items

    async def embed(self, name: str, texts: list[str], truncate: bool = True
                    ) -> tuple[list[list[float]], int]:
        """One normalised vector per text from GGUF model ``name`` (its device held while it
        computes), or from a tensor text encoder (:mod:`.text_encoder`), and the texts' token
        count; EmbeddingsUnsupported from a GGUF that cannot (one generating several sequences
        at once). ``truncate`` False: a GGUF's text over its context is a 400, not cut."""
        model = self.registry.catalog.resolve(name)
        if model.kind != "gguf":
            if self.text is None:
                raise CommandError(f"model {name!r} is a {model.kind} tensor model; it "
                                   "computes no embeddings here", field="model")
            return await self.text.embed(name, model, texts)
        lm = await self.registry.acquire(name)
        try:
            exe = lm.executable
            if not isinstance(exe, GenerativeExecutable) or not exe.can_embed:
                raise EmbeddingsUnsupported(
                    f"model {name!r} cannot compute embeddings here (a model generating "
                    "several sequences at once, [backends.llamacpp] parallel > 1, does not)",
                    field="model")
            loop = asyncio.get_running_loop()
            work = self.work.begin(name)
            ok = False
            try:
                async with self.devices.for_target(str(exe.target)).slot():
                    vectors = await loop.run_in_executor(self.executor, exe.embed, texts,
                                                         truncate)
                    tokens = sum([len(await loop.run_in_executor(self.executor, exe.tokenize, t))
                                  for t in texts])
                ok = True
            finally:
                self.work.end(work, ok=ok)
            return vectors, tokens
        finally:
            self.registry.release(lm)

    def adapter_in_name(self, name: str, params: dict[str, Any]
                        ) -> tuple[str, dict[str, Any]]:
        """``base:adapter`` (a model name any client can send, Ollama's included) as the base
        model and ``params["adapter"]``, when ``base`` is a model with that adapter; any other
        name as it is."""
        catalog = self.registry.catalog
        base, _, adapter = name.rpartition(":")
        if not base or name in catalog.entries():
            return name, params
        try:
            entry = catalog.entry(base)
        except NotFoundError:
            return name, params  # resolved (and refused, naming the models) by the caller
        if adapter not in entry.adapters:
            return name, params
        if params.get("adapter") not in (None, adapter):
            raise CommandError(f"model {name!r} names adapter {adapter!r} and the request "
                               f"asks for {params['adapter']!r}; name one", field="adapter")
        return base, {**params, "adapter": adapter}

    def _own_executor(self, exe: Executable) -> concurrent.futures.Executor:
        # llama.cpp runs every computation on the model's own thread (a hand-over per token
        # would cost). Otherwise a generation waits out its whole length in a thread of a
        # pool of the model's own, as many as it runs at once: on the daemon's shared pool,
        # N long chats would hold N of its few threads and stall every other blocking call
        # (tensor inference, sysfs, planning) until one ended.
        own = exe.executor if isinstance(exe, GenerativeExecutable) \
            and exe.max_concurrency == 1 else None
        if own is not None:
            return own
        pool = self._pools.get(exe)
        if pool is None:
            pool = self._pools[exe] = concurrent.futures.ThreadPoolExecutor(
                exe.max_concurrency, thread_name_prefix="generate")
            weakref.finalize(exe, pool.shutdown, wait=False)
        return pool

    async def _enter(self, lm: LoadedModel) -> Callable[[], None]:
        """Take the model's place; returns how to give it back (callable from any thread)."""
        exe = lm.executable
        device: DeviceQueue = self.devices.for_target(str(exe.target))
        loop = asyncio.get_running_loop()
        if exe.max_concurrency <= 1:
            await device.acquire()  # a full line is a 503 before any byte is streamed
            return device.release
        adm = self._admissions.get(exe)
        if adm is None or adm.n != exe.max_concurrency:
            adm = self._admissions[exe] = _Admission(
                lm.model.name, exe.max_concurrency, device.max_waiting)
            exe.step_guard = device.hold
        await adm.acquire()
        admission = adm

        def release() -> None:
            loop.call_soon_threadsafe(admission.release)

        return release

    async def _whole(self, lm: LoadedModel, call: Callable[..., Any], params: dict[str, Any],
                     work: WorkRequest, release: Callable[[], None]) -> dict[str, Any]:
        cancel = threading.Event()
        try:
            result: dict[str, Any] = await asyncio.get_running_loop().run_in_executor(
                self._own_executor(lm.executable),
                functools.partial(call, cancel=cancel, **params))
        except BaseException:
            self.work.end(work, ok=False)
            raise
        finally:
            cancel.set()  # cancelled (client gone, shutdown): the worker stops at its next token
            release()
            self.registry.release(lm)
        usage = result.get("usage")
        completion = int(usage.get("completion_tokens", 0)) if isinstance(usage, dict) else 0
        energy = self.work.end(work, tokens=completion)
        if isinstance(usage, dict):
            usage.update(energy_usage(energy, completion))
        return result

    async def _stream(self, lm: LoadedModel, call: Callable[..., Any], params: dict[str, Any],
                      work: WorkRequest, release: Callable[[], None]) -> AsyncGenerator[Any, None]:
        def done() -> None:
            release()
            self.registry.release(lm)

        worker = _Worker(self._own_executor(lm.executable), call, params, done)
        try:
            # wait for the first token: a request llama.cpp refuses (a prompt over the context,
            # an option the model was not loaded for) is then a proper error, not a stream
            # that starts and fails
            first = await worker.items.get()
        except BaseException:
            worker.finish()
            self.work.end(work, ok=False)
            raise
        if first[0] == "error":
            worker.finish()
            self.work.end(work, ok=False)
            raise first[1]
        body = self._items(worker, first, work)
        # a body that is never iterated (the client left before it started) runs no finally:
        # the request still stops counting as busy when the body is dropped (no-op once ended)
        weakref.finalize(body, self.work.end, work, ok=False)
        return body

    async def _items(self, worker: _Worker, first: tuple[str, Any], work: WorkRequest
                     ) -> AsyncGenerator[Any, None]:
        kind, item = first
        usage: dict[str, int] | None = None
        ok = False
        try:
            while True:
                if kind == "chunk":
                    yield item
                elif kind == "error":
                    yield item
                    break
                else:
                    ok, usage = True, item
                    break
                kind, item = await worker.items.get()
            completion = usage["completion_tokens"] if usage else 0
            energy = self.work.end(work, tokens=completion, ok=ok)
            yield StreamEnd(usage if ok else None, energy_usage(energy, completion))
        finally:
            self.work.end(work, ok=False)  # the client left mid-stream (no-op once ended)
            worker.finish()


class _Worker:
    """One streamed generation in a worker thread, handing chunks to the loop."""

    def __init__(self, executor: concurrent.futures.Executor, call: Callable[..., Any],
                 params: dict[str, Any], done: Callable[[], Any]) -> None:
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

        self.fut = loop.run_in_executor(executor, work)
        # the place is given back when the worker leaves the runtime, whatever happens to the
        # response (even one whose body is never iterated because the client left first)
        self.fut.add_done_callback(lambda _: done())

    def finish(self) -> None:
        """Stop generating at the next token (the place is freed once the worker is out)."""
        self.stop.set()
