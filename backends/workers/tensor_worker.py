"""The tensor worker process: one model's compiled executables (ONNX Runtime, TFLite, Arm NN)
outside the daemon.

Started by the daemon as ``edgepilot worker <backend> <model> --fd N`` (see
:mod:`.tensor_process`) when ``[backends.<backend>] isolation = "process"``. It builds the
backend with the options the daemon sends first and serves the connection on fd ``N``
(messages as in :mod:`edgepilot.backends.workers.link`):

parent -> worker: ``("open", {"settings": ..., "cache_dir": ...})`` once, then
``("compile", rid, xid, segment, target)``, ``("run", rid, xid, layout)``,
``("release", rid, xid)``, ``("close",)``.

worker -> parent: ``("ready", {"pid": ...})`` or ``("failed", error)``, then per request
``("result", rid, value)`` or ``("error", rid, error)``. ``compile`` answers the executable's
facts (target, tensor specs, memory); ``run`` reads its inputs from the daemon's block for
``xid`` and answers the layout of the outputs it wrote into its own block for ``xid`` (see
:mod:`.shm_tensors`).

The receive loop is :class:`~edgepilot.backends.workers.serve_loop.WorkerLoop`'s: the worker
ends when the daemon closes the connection or dies (EOF), so none outlives its daemon.
"""

from __future__ import annotations

import logging
import os
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from edgepilot.backends import backend_class, load_backend
from edgepilot.backends.base import Backend, Executable, Segment, Target
from edgepilot.backends.workers.exits import error_data
from edgepilot.backends.workers.serve_loop import WorkerLoop, run
from edgepilot.backends.workers.shm_tensors import AttachedBlocks, OwnedBlock
from edgepilot.errors import BackendError

log = logging.getLogger(__name__)


class Compiled:
    """One executable in the worker with its output block."""

    def __init__(self, exe: Executable) -> None:
        self.exe = exe
        self.out = OwnedBlock()


class TensorWorker(WorkerLoop):
    """One model's executables of one tensor backend."""

    def __init__(self, conn: Connection, backend_name: str) -> None:
        super().__init__(conn)
        self.backend_name = backend_name
        self.backend: Backend | None = None
        self.compiled: dict[int, Compiled] = {}
        self.inputs = AttachedBlocks()

    def open(self, options: dict[str, Any]) -> None:
        section = backend_class(self.backend_name).options_class(
            **(options.get("settings") or {}))
        backend = load_backend(self.backend_name, section)
        if options.get("cache_dir"):
            backend.cache_dir = Path(options["cache_dir"])
        self.backend = backend
        self.send(("ready", {"pid": os.getpid()}))

    def compile(self, xid: int, segment: Segment, target: Target) -> dict[str, Any]:
        assert self.backend is not None
        old = self.compiled.pop(xid, None)
        if old is not None:
            self._release(old)
        exe = self.backend.compile(segment, target)
        self.compiled[xid] = Compiled(exe)
        return {"target": str(exe.target), "inputs": exe.inputs, "outputs": exe.outputs,
                "memory_bytes": exe.memory_bytes, "max_concurrency": exe.max_concurrency}

    def run(self, xid: int, layout: dict[str, Any]) -> dict[str, Any]:
        entry = self.compiled.get(xid)
        if entry is None:
            raise BackendError(f"executable {xid} is not compiled in this worker")
        # views into the daemon's block: the runtime reads its inputs in place
        inputs = self.inputs.read(layout, str(xid), copy=False)
        outputs = entry.exe.run(inputs)
        del inputs
        return entry.out.write(outputs)

    def _release(self, entry: Compiled) -> None:
        entry.exe.close()
        entry.out.release()

    def release(self, xid: int) -> None:
        entry = self.compiled.pop(xid, None)
        self.inputs.drop(str(xid))
        if entry is not None:
            self._release(entry)

    def handle(self, msg: tuple[Any, ...]) -> None:
        # in this thread, one request at a time: handing each run to another thread costs
        # more than the run of a small model (~200 us per call on a loaded 2-core board); the
        # daemon holds one device per request anyway, and a model's executables on two devices
        # of one runtime then take turns here
        kind, rid, args = msg[0], msg[1], msg[2:]
        try:
            if kind == "compile":
                value: Any = self.compile(*args)
            elif kind == "run":
                value = self.run(*args)
            elif kind == "release":
                self.release(*args)
                value = None
            elif kind == "reset":
                value = None
                if (entry := self.compiled.get(args[0])) is not None:
                    entry.exe.reset_state()
            else:
                raise BackendError(f"unknown worker request {kind!r}")
            self.send(("result", rid, value))
        except Exception as exc:
            self.send(("error", rid, error_data(exc)))

    def finish(self, asked: bool) -> None:
        for xid in list(self.compiled):
            self.release(xid)


def main(fd: int, backend_name: str) -> int:
    """Serve the connection on ``fd`` (inherited from the daemon) until it closes."""
    return run(TensorWorker(Connection(fd), backend_name))
