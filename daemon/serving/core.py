"""The one owner of a tensor request: ``await serving.infer(name, inputs)``.

HTTP ``/v1/infer``, MQTT ``cmd/infer`` and the CLI all come here. A request resolves its model
once, is checked against the model's inputs, joins a dynamic batch when the model has one
(``[[models]] max_batch``), and runs on the dispatcher's plan for its shapes when there is one
— else whole on the model's default target while that plan is made in the background. Each
segment of a plan holds its device's queue only while it runs (see :mod:`.devices`), the
runtime call runs off the event loop, and the request's work and energy are recorded however
it ends. A deadline (``timeout_s``) is checked before each segment starts; a cancelled request
leaves its place in line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from edgepilot.backends.base import TensorSpec
from edgepilot.config import Config
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.execution.executor import CompiledPlan, SegmentFault
from edgepilot.dispatch.model_dispatch import ModelDispatch
from edgepilot.errors import (
    BackendError,
    CommandError,
    DeadlineExceeded,
    InputRejected,
    ModelError,
    NotFoundError,
    PlanError,
)
from edgepilot.formats.file_cache import FileKey, file_key
from edgepilot.formats.files import ResolvedModel
from edgepilot.formats.io import tensor_specs
from edgepilot.formats.tensors import check_inputs
from edgepilot.serving.batching import Batcher, batch_axes
from edgepilot.serving.devices import DeviceQueues
from edgepilot.serving.registry import ModelRegistry
from edgepilot.telemetry.work import WorkMeter

log = logging.getLogger(__name__)
T = TypeVar("T")
Tensors = dict[str, np.ndarray]


@dataclass
class InferResult:
    """A served request: outputs by name, the plan that ran (``single:<target>`` when whole),
    wall latency from arrival to answer, and the board energy attributed to it (None without
    a power sensor)."""

    outputs: Tensors
    plan: str
    latency_ms: float
    energy_j: float | None


class Serving:
    """Infer (tensor models) for every interface; generation lives in :mod:`.generate`."""

    def __init__(self, config: Config, *, registry: ModelRegistry, devices: DeviceQueues,
                 work: WorkMeter, dispatcher: Dispatcher | None,
                 executor: concurrent.futures.Executor) -> None:
        self.config = config
        self.registry = registry
        self.devices = devices
        self.work = work
        self.dispatcher = dispatcher
        self.executor = executor
        # file key -> input specs, so a request finds them without a hop off the loop (the
        # first read of a file's specs costs ms and runs in a worker thread)
        self._specs: dict[FileKey, list[TensorSpec]] = {}
        self._batchers: dict[str, Batcher] = {}
        # each backend target's probe result (PASS/FAIL/SKIP), for /readyz; filled at start
        self.targets: dict[str, str] = {}

    def reload(self, new: Config) -> None:
        """A reloaded config: new queue limits and batch settings from now on."""
        self.config = new
        self.devices.set_limit(new.http.max_queue)
        self._batchers.clear()

    async def run_blocking(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # ---- the request -------------------------------------------------------------------------
    def tensor_model(self, name: str) -> ResolvedModel:
        """The tensor model ``name`` (404 for unknown names, 400 for a GGUF model)."""
        model = self.registry.catalog.resolve(name)
        if model.kind == "gguf":
            raise CommandError(f"model {name!r} is a GGUF language model; use "
                               "POST /v1/chat/completions or /v1/completions", field="model")
        return model

    async def input_specs(self, model: ResolvedModel) -> list[TensorSpec]:
        """The model's declared inputs (cached per file version)."""
        key = file_key(model.path)
        specs = self._specs.get(key)
        if specs is None:
            ins, _ = await self.run_blocking(tensor_specs, model.path, model.kind)
            specs = self._specs[key] = list(ins)
        return specs

    async def infer(self, name: str, inputs: Tensors, *, timeout_s: float | None = None,
                    model: ResolvedModel | None = None) -> InferResult:
        """Serve one request to the tensor model ``name``.

        Raises NotFoundError / CommandError (bad model or inputs, 4xx), BusyError (the first
        device's line is full, 503), DeadlineExceeded (``timeout_s`` passed before it ran),
        or the runtime's error. ``model`` skips resolving when the caller already did.
        """
        arrived = time.monotonic()  # latency_ms counts the wait for a thread or a load too
        if timeout_s is not None and timeout_s <= 0:
            raise CommandError("timeout must be positive", field="timeout_ms")
        model = model or self.tensor_model(name)
        try:
            specs = await self.input_specs(model)
        except ModelError as exc:  # the file itself: what /v1/models says of it too
            self.registry.errors[name] = exc.message
            raise
        check_inputs(specs, inputs)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        req = self.work.begin(name)
        try:
            batcher = self._batcher(model, specs)
            if batcher is not None:
                outputs, plan = await batcher.submit(inputs, deadline)
            else:
                outputs, plan = await self.run(model, inputs, deadline)
        except BaseException as exc:  # cancelled too: the request must stop counting as busy
            self.work.end(req, ok=False)
            if isinstance(exc, ModelError):
                self.registry.errors[name] = exc.message
            raise
        self.registry.errors.pop(name, None)
        done = time.monotonic()
        energy = self.work.end(req, plan=plan, now=done)
        return InferResult(outputs, plan, round((done - arrived) * 1000, 3), energy)

    def _batcher(self, model: ResolvedModel, specs: list[TensorSpec]) -> Batcher | None:
        entry = model.entry
        if entry.max_batch <= 1:
            return None
        batcher = self._batchers.get(model.name)
        if batcher is None:
            axes = batch_axes(specs)
            if axes is None:
                log.warning("model %s: max_batch = %d ignored: not every input has a dynamic "
                            "first dimension to batch along", model.name, entry.max_batch)
                return None

            async def run(inputs: Tensors, deadline: float | None) -> tuple[Tensors, str]:
                return await self.run(model, inputs, deadline)

            batcher = self._batchers[model.name] = Batcher(
                model.name, run, entry.max_batch, entry.batch_wait_ms / 1000.0,
                pad=self.dispatcher is not None and self.config.dispatch.enabled)
        return batcher

    # ---- plan or whole -----------------------------------------------------------------------
    async def run(self, model: ResolvedModel, inputs: Tensors, deadline: float | None = None
                  ) -> tuple[Tensors, str]:
        """Outputs and the plan that ran: the dispatcher's plan for these shapes when it has
        one, else the whole model on its default target."""
        md = self._planned(model.name, inputs)
        if md is not None and md.plan is not None:
            try:
                return await self._run_plan(md, model, inputs, deadline)
            except (PlanError, BackendError, NotFoundError) as exc:
                # planning profiles with sample inputs and can fail where the request's own
                # shapes run fine; the whole model on its default target is the safe answer
                log.warning("plan of %s could not run (%s); running it whole", model.name,
                            exc.message)
            return await self._run_whole(model, inputs, deadline)
        answer = await self._run_whole(model, inputs, deadline)
        if md is not None and self.dispatcher is not None:
            self.dispatcher.plan_soon(model.name, md)  # these shapes ran: plan them
        return answer

    def _planned(self, name: str, inputs: Mapping[str, np.ndarray]) -> ModelDispatch | None:
        d = self.dispatcher
        if d is None or not self.config.dispatch.enabled:
            return None
        md = d.planned(name, inputs)  # one lookup per request
        return md if isinstance(md, ModelDispatch) else None

    async def _run_whole(self, model: ResolvedModel, inputs: Tensors, deadline: float | None
                         ) -> tuple[Tensors, str]:
        lm = await self.registry.acquire(model.name)
        try:
            target = str(lm.executable.target)
            async with self.devices.for_target(target).slot():
                _check_deadline(deadline, model.name)
                try:
                    outputs = await self.run_blocking(lm.executable.run, inputs)
                except BackendError as exc:
                    if type(exc) is not BackendError:  # a worker's crash, an unload: not data
                        raise
                    # inputs of the declared types and shapes the file's own runtime refuses
                    # (an id past the vocabulary, more positions than it has): the client's
                    raise InputRejected(f"model {model.name!r} refuses these input values on "
                                        f"its own runtime ({exc.message})",
                                        field="inputs") from None
        finally:
            self.registry.release(lm)
        return outputs, f"single:{target}"

    async def _run_plan(self, md: ModelDispatch, model: ResolvedModel, inputs: Tensors,
                        deadline: float | None) -> tuple[Tensors, str]:
        current = md.current()
        if current is None:
            raise PlanError(f"model {md.name} has no plan to serve on", field="model")
        compiled, plan = current
        try:
            outputs, times = await self._segments(md.name, compiled, inputs, deadline)
        except SegmentFault as fault:
            # the request's values or the target: the model whole on its own runtime tells
            # them apart. It refuses bad values too (InputRejected: nothing is excluded, where
            # one out-of-vocabulary id had every target excluded in turn); where it runs,
            # the segment's target is at fault: left out and replanned, this answer whole
            outputs, ran = await self._run_whole(model, inputs, deadline)
            await self.run_blocking(md.fault, fault, plan.hash)
            return outputs, ran
        # the monitor is cheap; a drift replan is not (seconds: compiles, a side by side): it
        # runs in a worker thread after this answer, not before it (a 6 ms request took 3.8 s)
        with contextlib.suppress(RuntimeError):  # (shut down: a stop, nothing left to watch)
            self.executor.submit(md.observe, compiled, times).add_done_callback(_failed_observe)
        return outputs, plan.hash

    async def _segments(self, name: str, compiled: CompiledPlan, inputs: Tensors,
                        deadline: float | None) -> tuple[Tensors, list[float]]:
        env: Tensors = dict(inputs)
        times: list[float] = []
        for k, seg in enumerate(compiled.segments):
            # only the first device turns an overlong line into a 503: a request already
            # running is finished, not dropped between two segments
            async with self.devices.for_target(seg.target).slot(limit=k == 0):
                _check_deadline(deadline, name)
                out, ms = await self.run_blocking(compiled.step, k, env)
            env.update(out)
            times.append(ms)
        return compiled.collect(env), times


def _failed_observe(fut: concurrent.futures.Future[None]) -> None:
    exc = None if fut.cancelled() else fut.exception()
    if exc is not None:  # the answer went out already: the log is where this can be told
        log.error("watching a plan after a request failed: %s",
                  getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}")


def _check_deadline(deadline: float | None, name: str) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise DeadlineExceeded(f"request to {name!r} waited past its deadline before it could "
                               "run; raise timeout_ms or send fewer requests at once",
                               field="timeout_ms")
