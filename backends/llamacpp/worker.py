"""The llama.cpp worker process: one served GGUF outside the daemon.

Started by the daemon as ``edgepilot worker llamacpp <model> --fd N`` (see
:mod:`.proxy`), it loads the model with the options the daemon sends first — the same
:meth:`LlamaCppBackend.open` the in-process path uses — and serves the executable's calls over
the connection on fd ``N``. Messages are tuples of plain data (pickled by
:mod:`multiprocessing.connection`):

worker -> parent first: ``("hello", pid)`` once llama-cpp-python is imported (a spare worker,
:mod:`.spare`, says it long before it is handed a model).

parent -> worker: ``("open", options)`` once, then ``("call", rid, method, kwargs)``,
``("cancel", rid)``, ``("guard", on)``, ``("step_go", token)``, ``("close",)``.

worker -> parent: ``("ready", facts)`` or ``("failed", error)``, then per request
``("chunk", rid, chunk)``\\*, ``("result", rid, value, observed)`` or ``("error", rid, error)``;
``("step", token)`` / ``("step_done", token)`` around each decode step of a parallel model
while the parent's step guard is on (the parent holds its device for that step);
``("beat", tokens, step_tokens)`` every HEARTBEAT_S: tokens llama.cpp decoded so far and
those of the decode under way (the daemon's hang watchdog).

The receive loop is :class:`~edgepilot.backends.workers.serve_loop.WorkerLoop`'s: the worker
ends when the daemon closes the connection or dies (the kernel closes a killed daemon's end:
EOF), so no worker outlives its daemon. (Not PR_SET_PDEATHSIG: Linux sends it
when the *thread* that started the worker ends, and a restart starts it from a passing thread.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from edgepilot.backends.base import BackendUnavailable
from edgepilot.backends.llamacpp.executable import LlamaExecutable
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.backends.llamacpp.runtime import LLAMA_THREAD, import_llama_cpp
from edgepilot.backends.workers.exits import SPARE, SPARE_PLACEHOLDER, error_data
from edgepilot.backends.workers.proctitle import replace_arg
from edgepilot.backends.workers.serve_loop import WorkerLoop, run
from edgepilot.errors import EdgepilotError

log = logging.getLogger(__name__)
# how often the worker tells the daemon how many decode steps it has done
HEARTBEAT_S = 0.5


class RelayGovernor:
    """The parent's thread governor as the worker sees it: the thread count the parent chose
    for the request (per request thread; the latest one between parallel steps) and the decode
    speed observed, kept for the request's answer."""

    def __init__(self, threads: int | None) -> None:
        self.latest = threads
        self.local = threading.local()

    def threads_for_request(self) -> int | None:
        return getattr(self.local, "threads", None) or self.latest

    def observed(self, n_threads: int, decode_ms_per_token: float, tokens: int) -> None:
        self.local.observed = (n_threads, decode_ms_per_token, tokens)


class Worker(WorkerLoop):
    """One served GGUF: calls run in threads, answers go out under the loop's lock."""

    def __init__(self, conn: Connection) -> None:
        super().__init__(conn)
        self.exe: LlamaExecutable | None = None
        self.governor = RelayGovernor(None)
        self.cancels: dict[int, threading.Event] = {}
        self.steps: dict[int, threading.Event] = {}
        self.step_token = 0
        self.step_lock = threading.Lock()

    def open(self, options: dict[str, Any]) -> None:
        # imported here: llamacpp imports the batch engine and the parallel executable
        from edgepilot.backends.llamacpp.backend import LlamaCppBackend

        if options.get("model"):  # a spare now serves this model: ps says which
            replace_arg(SPARE_PLACEHOLDER, str(options["model"]))
        backend = LlamaCppBackend(LlamacppSection(**options["settings"]))
        if options.get("cache_dir"):
            backend.cache_dir = Path(options["cache_dir"])  # the daemon's, for spilled KV
        # the daemon's header facts: reading them again costs tens of ms of a cheap start
        exe = backend.open(Path(options["path"]), n_ctx=options["n_ctx"],
                           n_gpu_layers=options["n_gpu_layers"], parallel=options["parallel"],
                           adapters={k: Path(v) for k, v in options.get("adapters", {}).items()},
                           info=options.get("info"))
        if options.get("threads"):
            exe.set_threads(int(options["threads"]))
        self.governor.latest = options.get("threads")
        exe.governor = self.governor
        self.exe = exe
        self.set_guard(bool(options.get("guard")))
        threading.Thread(target=self.beat, name="heartbeat", daemon=True).start()
        self.send(("ready", {
            "pid": os.getpid(), "n_ctx": exe.n_ctx, "n_threads": exe.n_threads,
            "n_gpu_layers": exe.n_gpu_layers, "max_concurrency": exe.max_concurrency,
            "target": str(exe.target), "memory_bytes": exe.memory_bytes,
            "n_vocab": exe.outputs[0].shape[0], "load_split": exe.load_split}))

    def beat(self) -> None:
        """Tell the daemon how far llama.cpp got, every HEARTBEAT_S: the steps stop growing
        when llama.cpp hangs (this thread runs on: ctypes calls release the GIL), and the beats
        stop when the whole process does."""
        while True:
            time.sleep(HEARTBEAT_S)
            exe = self.exe
            if exe is None:
                continue
            try:
                self.send(("beat", *exe.progress))
            except OSError:
                return

    def set_guard(self, on: bool) -> None:
        assert self.exe is not None
        self.exe.step_guard = self.remote_step if on and self.exe.max_concurrency > 1 else None

    @contextlib.contextmanager
    def remote_step(self) -> Iterator[None]:
        """One decode step held under the parent's step guard: ask, wait for the go, step,
        say done (the parent then gives its device back)."""
        with self.step_lock:
            self.step_token += 1
            token = self.step_token
            go = self.steps[token] = threading.Event()
        self.send(("step", token))
        go.wait()
        try:
            yield
        finally:
            self.send(("step_done", token))

    def handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "call":
            self.start(msg[1], msg[2], msg[3])
        elif kind == "cancel":
            event = self.cancels.get(msg[1])
            if event is not None:
                event.set()
        elif kind == "step_go":
            with self.step_lock:
                go = self.steps.pop(msg[1], None)
            if go is not None:
                go.set()
        elif kind == "guard":
            self.set_guard(bool(msg[1]))

    def finish(self, asked: bool) -> None:
        # asked to close: free the model; the daemon gone: leave at once
        if asked and self.exe is not None:
            self.exe.close()

    def start(self, rid: int, method: str, kwargs: dict[str, Any]) -> None:
        assert self.exe is not None
        self.cancels[rid] = threading.Event()
        if self.exe.max_concurrency == 1 and method in ("chat", "complete"):
            # one request at a time: run it on the llama.cpp thread itself, so that no token
            # is handed between threads inside the worker (see LlamaThread)
            LLAMA_THREAD.executor.submit(self.call, rid, method, kwargs)
        else:
            threading.Thread(target=self.call, args=(rid, method, kwargs), daemon=True,
                             name=f"request-{rid}").start()

    def call(self, rid: int, method: str, kwargs: dict[str, Any]) -> None:
        exe = self.exe
        assert exe is not None
        cancel = self.cancels[rid]
        self.governor.local.threads = kwargs.pop("threads", None)
        if self.governor.local.threads:
            self.governor.latest = self.governor.local.threads
        self.governor.local.observed = None
        try:
            if method in ("chat", "complete"):
                arg = kwargs.pop("messages" if method == "chat" else "prompt")
                out = getattr(exe, method)(arg, cancel=cancel, **kwargs)
                if kwargs.get("stream"):
                    for chunk in out:
                        self.send(("chunk", rid, chunk))
                    out = out.usage
                value: Any = out
            elif method == "tokenize":
                value = exe.tokenize(kwargs["text"])
            elif method == "embed":
                value = exe.embed(kwargs["texts"], kwargs.get("truncate", True))
            elif method == "run":
                value = exe.run(kwargs["inputs"])
            elif method == "set_threads":
                exe.set_threads(int(kwargs["n_threads"]))
                value = exe.n_threads
            else:
                raise EdgepilotError(f"unknown worker call {method!r}")
            self.send(("result", rid, value, self.governor.local.observed))
        except Exception as exc:
            self.send(("error", rid, error_data(exc)))
        finally:
            self.cancels.pop(rid, None)


def main(fd: int, model: str) -> int:
    """Serve the connection on ``fd`` (inherited from the daemon) until it closes: import
    llama-cpp-python first and say hello (a spare then waits for its model with the imports
    done), then the model arrives."""
    # the daemon's Ctrl-C reaches the whole process group: the daemon decides when we stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if model == SPARE_PLACEHOLDER:  # the placeholder only made room for the model's name
        replace_arg(SPARE_PLACEHOLDER, SPARE)
    worker = Worker(Connection(fd))
    # the imports a load would do (the backend module imports the batch engine)
    from edgepilot.backends.llamacpp import backend  # noqa: F401

    with contextlib.suppress(BackendUnavailable):  # the open reports it
        import_llama_cpp()
    with contextlib.suppress(OSError):  # a daemon gone already: serve() sees the EOF
        worker.send(("hello", os.getpid()))
    return run(worker)
