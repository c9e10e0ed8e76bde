"""Tensor backends in worker processes (``[backends.<name>] isolation = "process"``): the
daemon's side.

:class:`IsolatedBackend` wraps a backend: probing and support checks stay in the daemon, and
``compile(segment, target)`` returns a :class:`WorkerExecutable` that runs in the worker of
(backend, model) — ``edgepilot worker <backend> <model>``, one per model, holding every
executable of that model on that backend (a whole model, or the segments of its plan). Tensors
cross through shared memory (:mod:`.shm_tensors`), one block per direction per executable,
reused from call to call.

A worker that dies (a native crash, an OOM kill, an operator's kill) costs only the requests on
it: each gets a :class:`~.exits.WorkerCrashed` naming the signal — the dispatcher
then leaves the target out and replans, a whole-model request fails with it — and a
``backend.fault`` event goes out per target the worker held. The next use starts a new worker
after a backoff (0.5 s, doubling to 30 s while it keeps dying) and compiles its executables in
it again.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edgepilot.backends.base import (
    Backend,
    BackendOptions,
    Executable,
    ModelKind,
    Segment,
    Support,
    Target,
    TensorSpec,
)
from edgepilot.backends.workers.exits import WorkerCrashed
from edgepilot.backends.workers.link import WorkerLink, how_it_ended
from edgepilot.backends.workers.shm_tensors import AttachedBlocks, OwnedBlock

log = logging.getLogger(__name__)
# restart backoff: first delay, the most, and how long a worker must live to reset it
BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
STABLE_S = 60.0
# how long a worker outlives its last executable: the profiler compiles, times and closes one
# cell after another, and a new worker for each would cost its start (~1.5 s) every time
LINGER_S = 30.0
Emit = Callable[..., Any]


def model_of(segment: Segment) -> str:
    """The model a segment belongs to, as the worker's command line names it: the registry's
    name for a whole model, the file's stem for a plan's ``stem[start:end]``."""
    name = segment.name.split("[", 1)[0] if segment.name else ""
    return name or segment.model_path.stem


class ModelWorker:
    """The worker process of one (backend, model) and the executables compiled in it."""

    def __init__(self, backend: str, model: str, options: dict[str, Any],
                 emit: Emit | None, linger_s: float = LINGER_S) -> None:
        self.backend, self.model = backend, model
        self._options = options
        self._emit = emit
        self.linger_s = linger_s
        self._retire: threading.Timer | None = None
        self._lock = threading.Lock()
        self._link: WorkerLink | None = None
        self.generation = 0          # bumped per started worker: executables compile again
        self.restarts = 0
        self._failures = 0           # deaths in a row (reset once a worker lived STABLE_S)
        self._next_start = 0.0       # monotonic time before which no worker is started
        self._ids = itertools.count(1)
        self.executables: dict[int, WorkerExecutable] = {}

    def link(self) -> tuple[WorkerLink, int]:
        """The live worker and its generation, started (after the backoff) when none is."""
        with self._lock:
            link = self._link
            if link is not None and link.alive:
                return link, self.generation
            time.sleep(max(0.0, self._next_start - time.monotonic()))
            try:
                new = WorkerLink(self.backend, self.model, self._options, self._died)
            except Exception:
                self._failures += 1
                self._next_start = time.monotonic() + self._backoff()
                raise
            self._link = new
            self.generation += 1
            if link is not None:
                self.restarts += 1
                self._event("worker.restarted", pid=new.pid, previous_pid=link.pid,
                            restarts=self.restarts)
            return new, self.generation

    @property
    def pid(self) -> int | None:
        link = self._link
        return link.pid if link is not None and link.alive else None

    @property
    def in_flight(self) -> int:
        """Requests sent to the live worker and not answered yet."""
        link = self._link
        return len(link.pending) if link is not None else 0

    def _backoff(self) -> float:
        return min(MAX_BACKOFF_S, BACKOFF_S * 2 ** max(0, self._failures - 1))

    def _died(self, link: WorkerLink) -> None:
        # on the dead worker's reader thread: count it, say so; the next use restarts it
        lived = time.monotonic() - link.started
        self._failures = 1 if lived >= STABLE_S else self._failures + 1
        delay = self._backoff()
        self._next_start = time.monotonic() + delay
        fault = how_it_ended(link.returncode)
        log.error("%s worker for model %s (pid %d) %s; %d request(s) lost, restarting on the "
                  "next use in >= %.1f s", self.backend, self.model, link.pid, fault,
                  link.in_flight_lost, delay)
        targets = sorted({str(exe.target) for exe in list(self.executables.values())})
        for target in targets or [self.backend]:
            self._event("backend.fault", backend=self.backend, target=target, pid=link.pid,
                        exit=link.returncode, in_flight=link.in_flight_lost,
                        restart_in_s=delay, message=link.fault.message if link.fault else fault)

    def _event(self, kind: str, **fields: Any) -> None:
        if self._emit is not None:
            try:
                self._emit(kind, model=self.model, **fields)
            except Exception:  # an event sink must not turn a fault into a second one
                log.exception("could not emit %s", kind)

    def compile(self, segment: Segment, target: Target) -> WorkerExecutable:
        exe = WorkerExecutable(self, next(self._ids), segment, target)
        with self._lock:
            self.executables[exe.xid] = exe
            if self._retire is not None:
                self._retire.cancel()
                self._retire = None
        try:
            exe.ensure()
        except BaseException:
            self.release(exe)
            raise
        return exe

    def release(self, exe: WorkerExecutable) -> None:
        """Forget ``exe`` in the worker; the worker leaves ``linger_s`` after its last
        executable unless another is compiled meanwhile."""
        with self._lock:
            self.executables.pop(exe.xid, None)
            link = self._link
            if not self.executables and link is not None and self._retire is None:
                self._retire = threading.Timer(self.linger_s, self._leave_if_unused, (link,))
                self._retire.daemon = True
                self._retire.start()
        if link is not None and link.alive:
            with contextlib.suppress(WorkerCrashed):  # gone meanwhile: nothing to release
                link.call("release", exe.xid)

    def _leave_if_unused(self, link: WorkerLink) -> None:
        with self._lock:
            self._retire = None
            unused = not self.executables and self._link is link
            if unused:
                self._link = None
        if unused:
            link.close()

    def close(self) -> None:
        with self._lock:
            link, self._link = self._link, None
            self.executables.clear()
            if self._retire is not None:
                self._retire.cancel()
                self._retire = None
        if link is not None and link.alive:
            link.close()


class WorkerExecutable(Executable):
    """An executable compiled in a worker; :meth:`run` passes tensors through shared memory.

    One call at a time (the serving layer holds the device for a call; the blocks are this
    executable's)."""

    def __init__(self, worker: ModelWorker, xid: int, segment: Segment, target: Target) -> None:
        self.worker = worker
        self.xid = xid
        self.segment = segment
        self.target = target
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        self._memory = 0
        self._generation = 0
        self._lock = threading.Lock()
        self._in = OwnedBlock()
        self._out = AttachedBlocks()
        self._closed = False

    def ensure(self) -> WorkerLink:
        """The live worker with this executable compiled in it (again, after a restart)."""
        link, generation = self.worker.link()
        if generation != self._generation:
            self._out.clear()  # the old worker's blocks are gone with it
            facts = link.call("compile", self.xid, self.segment, self.target)
            self.target = Target.parse(facts["target"])
            self.inputs, self.outputs = list(facts["inputs"]), list(facts["outputs"])
            self._memory = int(facts["memory_bytes"])
            self.max_concurrency = int(facts["max_concurrency"])
            self._generation = generation
        return link

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run in the worker: inputs into this executable's block, outputs copied out of the
        worker's; a worker that dies under the call is a WorkerCrashed naming the signal."""
        with self._lock:
            if self._closed:
                raise WorkerCrashed(f"executable for model {self.worker.model!r} on "
                                    f"{self.target} was closed", field="model")
            link = self.ensure()
            if self.inputs:  # only this segment's inputs cross (a plan passes every tensor)
                inputs = {s.name: inputs[s.name] for s in self.inputs if s.name in inputs}
            layout = self._in.write(inputs)
            answer = link.call("run", self.xid, layout)
            return self._out.read(answer, "out", copy=True)

    def reset_state(self) -> None:
        with self._lock:
            if not self._closed:
                self.ensure().call("reset", self.xid)

    @property
    def memory_bytes(self) -> int:
        return self._memory

    @property
    def worker_pid(self) -> int | None:
        """The pid of the worker serving this executable (None while none runs)."""
        return self.worker.pid

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.worker.release(self)
            self._out.clear()
            self._in.release()


class IsolatedBackend(Backend):
    """``inner`` with its executables in worker processes, one per model (see the module
    docstring). Everything but :meth:`compile` is the inner backend's, in the daemon."""

    def __init__(self, inner: Backend, settings: BackendOptions, emit: Emit | None = None,
                 linger_s: float = LINGER_S) -> None:
        self.inner = inner
        self.name = inner.name
        self.settings = settings
        self.emit = emit
        self.linger_s = linger_s
        self._lock = threading.Lock()
        self._workers: dict[str, ModelWorker] = {}

    def __getattr__(self, attr: str) -> Any:
        # runtime extras (devices, segment_model, ...) stay the inner backend's
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def probe(self) -> list[Target]:
        return self.inner.probe()

    def supports(self, segment: Segment, target: Target) -> Support:
        return self.inner.supports(segment, target)

    def takes(self, kind: ModelKind) -> bool:
        return self.inner.takes(kind)

    def version(self) -> str | None:
        return self.inner.version()

    def _options(self) -> dict[str, Any]:
        cache_dir = self.inner.cache_dir
        return {"settings": self.settings.model_dump(mode="json"),
                "cache_dir": str(cache_dir) if cache_dir else None}

    def worker(self, model: str) -> ModelWorker:
        """The worker of ``model`` on this backend (started by the first compile)."""
        with self._lock:
            worker = self._workers.get(model)
            if worker is None:
                worker = self._workers[model] = ModelWorker(
                    self.name, model, self._options(), self._emit, self.linger_s)
            return worker

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.emit is not None:
            self.emit(kind, **fields)

    def compile(self, segment: Segment, target: Target) -> Executable:
        """Compile ``segment`` in its model's worker; the runtime's error when it cannot."""
        return self.worker(model_of(segment)).compile(segment, target)

    def close(self) -> None:
        """End every worker now (an executable still open starts a new one on its next run)."""
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for worker in workers:
            worker.close()
