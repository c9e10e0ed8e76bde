"""A served GGUF in a worker process (``[backends.llamacpp] isolation = "process"``, the
default): the daemon's side of it.

:class:`LlamaWorkerExecutable` keeps the executable contract the serving layer uses (``chat``,
``complete``, ``tokenize``, ``run``, ``set_threads``, ``max_concurrency``, ``step_guard``,
cancellation, ``memory_bytes``, ``close``) and forwards each call to the worker, one request
stream per call in flight. A worker that dies costs only the requests on it: each gets a
:class:`~..workers.exits.WorkerCrashed` naming the signal, a ``backend.fault`` event goes
out, and a new worker is started after a backoff (0.5 s, doubling to 30 s while it keeps
dying); a request that arrives meanwhile waits for it.

Step guard (``parallel`` > 1): the worker asks before each decode step and the daemon holds its
step guard (the device) until the worker says the step is done — one round trip per step.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgepilot.backends.base import GenerativeExecutable, Target, TensorSpec
from edgepilot.backends.llamacpp.aborts import AbortedGrammars
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.backends.llamacpp.process import StepGuard, WorkerCrashed, WorkerProcess
from edgepilot.backends.llamacpp.runtime import ThreadGovernor
from edgepilot.backends.llamacpp.spare import SparePool
from edgepilot.formats.gguf_info import GgufInfo

# restart backoff: first delay, the most, and how long a worker must live to reset it
BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
STABLE_S = 60.0
# how often a waiting call looks at its cancel event (a cancel is forwarded to the worker)
CANCEL_POLL_S = 0.05
Emit = Callable[..., Any]


class Call:
    """One call in flight in the worker: its answers, and its cancel event forwarded once."""

    def __init__(self, worker: WorkerProcess, method: str, kwargs: dict[str, Any],
                 cancel: threading.Event | None) -> None:
        self.worker = worker
        self.cancel = cancel
        self.cancelled = False
        self.rid, self.answers = worker.request(method, kwargs)

    def next(self) -> tuple[Any, ...]:
        """The next message for this call; a set cancel event is sent on first sight (looked at
        before each message and every CANCEL_POLL_S while none comes)."""
        while True:
            if self.cancel is not None and not self.cancelled and self.cancel.is_set():
                self.send_cancel()
            if self.cancel is None or self.cancelled:
                return self.answers.get()
            try:
                return self.answers.get(timeout=CANCEL_POLL_S)
            except queue.Empty:
                continue

    def send_cancel(self) -> None:
        self.cancelled = True
        # a worker gone meanwhile: the reader answers the call with the fault
        with contextlib.suppress(WorkerCrashed):
            self.worker.send(("cancel", self.rid))

    def abandon(self) -> None:
        """The caller leaves before the end: stop the call in the worker and wait until it
        has (the caller's device is free only once the worker is)."""
        if not self.cancelled:
            self.send_cancel()
        while self.answers.get()[0] == "chunk":
            pass

    def done(self) -> None:
        self.worker.forget(self.rid)


class WorkerTokenStream:
    """Chunks of one streamed generation in the worker; :attr:`usage` once exhausted.

    The request is sent when iteration starts; leaving early cancels it in the worker."""

    def __init__(self, exe: LlamaWorkerExecutable, method: str, kwargs: dict[str, Any],
                 cancel: threading.Event | None) -> None:
        self._exe = exe
        self._method = method
        self._kwargs = kwargs
        self._cancel = cancel
        self.usage: dict[str, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        call = Call(self._exe.worker(), self._method, self._kwargs, self._cancel)
        finished = False
        try:
            while True:
                msg = call.next()
                if msg[0] == "chunk":
                    yield msg[1]
                    continue
                finished = True
                if msg[0] == "error":
                    self._exe.failed(call.worker, self._kwargs, msg[1])
                    raise msg[1]
                self.usage = msg[1]
                self._exe.observed(msg[2])
                return
        finally:
            if not finished:
                call.abandon()
            call.done()


class LlamaWorkerExecutable(GenerativeExecutable):
    """A GGUF served by ``edgepilot worker llamacpp <model>``; restarted when it dies."""

    def __init__(self, model: str, path: Path, settings: LlamacppSection, *,
                 n_ctx: int | None = None, n_gpu_layers: int | None = None,
                 parallel: int | None = None, emit: Emit | None = None,
                 governor: ThreadGovernor | None = None, cache_dir: Path | None = None,
                 adapters: dict[str, Path] | None = None, info: GgufInfo | None = None,
                 spares: SparePool | None = None, n_threads: int | None = None) -> None:
        """``spares``: where a started worker process waits for a model (one is taken for each
        start, refilled after it); ``info``: the file's header facts, read already."""
        self.model = model
        self._spares = spares
        self._options: dict[str, Any] = {
            "model": model, "info": info,
            "path": str(path), "n_ctx": n_ctx, "n_gpu_layers": n_gpu_layers,
            "parallel": parallel, "settings": settings.model_dump(), "threads": n_threads,
            "guard": False, "cache_dir": None if cache_dir is None else str(cache_dir),
            "adapters": {k: str(v) for k, v in (adapters or {}).items()}}
        self._emit = emit
        self._start_lock = threading.Lock()
        self._closed = False
        self._failures = 0          # deaths in a row (reset once a worker lived STABLE_S)
        self._next_start = 0.0      # monotonic time before which no worker is started
        self._step_guard: StepGuard | None = None
        # the GGUF plan: the thread count per request, the decode speed the worker saw
        self.governor = governor
        self.restarts = 0
        self.aborted = AbortedGrammars(model)  # grammars that made llama.cpp abort a worker
        self._worker: WorkerProcess = self._start()

    # ---- the worker ----------------------------------------------------------------------------
    def _start(self) -> WorkerProcess:
        self._options["guard"] = self._step_guard is not None
        spare = self._spares.take() if self._spares is not None else None
        started = time.monotonic()
        try:
            worker = WorkerProcess(self.model, dict(self._options), self._get_guard, self._died,
                                   spawned=spare)
        except WorkerCrashed:
            if spare is None:
                raise
            # the spare died as it was handed over (killed meanwhile): start one as before
            started = time.monotonic()
            spare = None
            worker = WorkerProcess(self.model, dict(self._options), self._get_guard, self._died)
        finally:
            if self._spares is not None:
                self._spares.refill()  # after the load: its imports would slow this one
        facts = worker.facts
        # where the load went: waiting for a worker with llama-cpp-python imported (about 0 for
        # a spare), then llama.cpp's model load and context creation in it
        wait = worker.start_wait_s if worker.start_wait_s is not None else \
            time.monotonic() - started
        self.load_split = {"worker_start_ms": round(wait * 1e3, 1), "spare": spare is not None,
                           **(facts.get("load_split") or {})}
        self.target = Target.parse(facts["target"])
        self.n_ctx = int(facts["n_ctx"])
        self.n_threads = int(facts["n_threads"])
        self.n_gpu_layers = int(facts["n_gpu_layers"])
        self.max_concurrency = int(facts["max_concurrency"])
        self._memory = int(facts["memory_bytes"])
        self.inputs = [TensorSpec("tokens", "int32", (None,))]
        self.outputs = [TensorSpec("logits", "float32", (int(facts["n_vocab"]),))]
        return worker

    def worker(self) -> WorkerProcess:
        """The live worker, started anew (after the backoff) when the last one died."""
        worker = self._worker
        if worker.fault is None:
            return worker
        with self._start_lock:
            if self._worker.fault is None:
                return self._worker
            if self._closed:
                raise WorkerCrashed(f"model {self.model!r} was unloaded", field="model")
            old = self._worker
            time.sleep(max(0.0, self._next_start - time.monotonic()))
            if self._closed:  # unloaded during the backoff
                raise WorkerCrashed(f"model {self.model!r} was unloaded", field="model")
            try:
                self._worker = self._start()
            except Exception:
                self._failures += 1
                self._next_start = time.monotonic() + self._backoff()
                raise
            self.restarts += 1
            self._event("worker.restarted", pid=self._worker.pid, previous_pid=old.pid,
                        restarts=self.restarts)
            return self._worker

    def _backoff(self) -> float:
        return min(MAX_BACKOFF_S, BACKOFF_S * 2 ** max(0, self._failures - 1))

    def _died(self, worker: WorkerProcess) -> None:
        # on the dead worker's reader thread: count it, say so, restart after the backoff
        self._failures = 1 if time.monotonic() - worker.started >= STABLE_S else self._failures + 1
        delay = self._backoff()
        self._next_start = time.monotonic() + delay
        self._event("backend.fault", backend="llamacpp", pid=worker.pid,
                    exit=worker.returncode, in_flight=worker.in_flight_lost,
                    restart_in_s=delay, message=worker.fault.message if worker.fault else "")
        threading.Thread(target=self._restart_soon, name=f"llama-restart-{self.model}",
                         daemon=True).start()

    def _restart_soon(self) -> None:
        try:
            if not self._closed:
                self.worker()
        except Exception as exc:  # the next request tries again, and reports
            if not self._closed:
                self._event("worker.restart_failed", message=str(exc))

    def _event(self, kind: str, **fields: Any) -> None:
        if self._emit is not None:
            self._emit(kind, model=self.model, **fields)

    @property
    def worker_pid(self) -> int | None:
        """The pid of the worker serving this model (None while it is being restarted)."""
        worker = self._worker
        return worker.pid if worker.fault is None else None

    @property
    def hang_deadline_s(self) -> float | None:
        """How long the worker may now go without a decode step with requests in flight before
        it is killed as hung (None: the watchdog is off, hang_timeout_s = 0)."""
        worker = self._worker
        return worker.deadline_s() if worker.hang_min_s > 0 else None

    # ---- the executable contract ---------------------------------------------------------------
    @property
    def memory_bytes(self) -> int:
        return self._memory

    @property
    def step_guard(self) -> StepGuard | None:
        return self._step_guard

    @step_guard.setter
    def step_guard(self, guard: StepGuard | None) -> None:
        changed = (guard is None) != (self._step_guard is None)
        self._step_guard = guard
        if changed and self._worker.fault is None:
            # a worker gone meanwhile: its successor is started with the guard
            with contextlib.suppress(WorkerCrashed):
                self._worker.send(("guard", guard is not None))

    def _get_guard(self) -> StepGuard | None:
        return self._step_guard

    def observed(self, observed: Any) -> None:
        """The decode speed the worker measured for one request, for the governor."""
        if observed and self.governor is not None:
            n_threads, ms, tokens = observed
            self.governor.observed(int(n_threads), float(ms), int(tokens))

    def _generate(self, method: str, key: str, arg: Any, cancel: threading.Event | None,
                  params: dict[str, Any]) -> Any:
        self.aborted.refuse(params)  # a grammar that aborted a worker is not sent again
        kwargs = {key: arg, **params}
        if self.governor is not None:
            kwargs["threads"] = self.governor.threads_for_request()
        if params.get("stream"):
            return WorkerTokenStream(self, method, kwargs, cancel)
        call = Call(self.worker(), method, kwargs, cancel)
        try:
            msg = call.next()
        finally:
            call.done()
        if msg[0] == "error":
            self.failed(call.worker, kwargs, msg[1])
            raise msg[1]
        self.observed(msg[2])
        return msg[1]

    def failed(self, worker: WorkerProcess, kwargs: dict[str, Any], exc: BaseException) -> None:
        """A call failed with ``exc``: a worker that died of llama.cpp's abort under a grammar
        leaves that grammar refused (:mod:`.aborts`)."""
        if isinstance(exc, WorkerCrashed):
            self.aborted.died(kwargs, worker.returncode, worker.pid)

    def chat(self, messages: list[dict[str, Any]], *, cancel: threading.Event | None = None,
             **params: Any) -> Any:
        """llama-cpp-python's ``create_chat_completion`` in the worker: a dict, or
        (``stream=True``) a :class:`WorkerTokenStream`; ``cancel`` ends it at the next token."""
        return self._generate("chat", "messages", messages, cancel, params)

    def complete(self, prompt: str, *, cancel: threading.Event | None = None,
                 **params: Any) -> Any:
        """``create_completion`` in the worker (a dict, or a :class:`WorkerTokenStream`)."""
        return self._generate("complete", "prompt", prompt, cancel, params)

    def tokenize(self, text: str) -> list[int]:
        return list(self.worker().call_method("tokenize", text=text))

    can_embed = True

    def embed(self, texts: Sequence[str], truncate: bool = True) -> list[list[float]]:
        """The worker's :meth:`LlamaExecutable.embed`."""
        return list(self.worker().call_method("embed", texts=list(texts), truncate=truncate))

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Evaluate ``tokens`` in the worker; the last position's logits."""
        out: dict[str, np.ndarray] = self.worker().call_method("run", inputs=dict(inputs))
        return out

    def set_threads(self, n_threads: int) -> None:
        """Threads for decode and prompt batches, in this worker and every restarted one."""
        self._options["threads"] = n_threads
        self.n_threads = int(self.worker().call_method("set_threads", n_threads=n_threads))

    def close(self) -> None:
        self._closed = True  # a restart waiting out its backoff gives up
        with self._start_lock:
            self._worker.close()
