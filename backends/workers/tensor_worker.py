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

The worker ends when the daemon closes the connection or dies (EOF), so none outlives its
daemon.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from edgepilot.backends import load_backend
from edgepilot.backends.armnn_options import ArmnnSection
from edgepilot.backends.base import Backend, Executable, Segment, Target
from edgepilot.backends.onnxrt_options import OnnxRuntimeSection
from edgepilot.backends.tflite_options import TfliteSection
from edgepilot.backends.workers.exits import error_data
from edgepilot.backends.workers.shm_tensors import AttachedBlocks, OwnedBlock
from edgepilot.errors import BackendError

log = logging.getLogger(__name__)
SECTIONS: dict[str, type[Any]] = {"onnxruntime": OnnxRuntimeSection, "tflite": TfliteSection,
                                  "armnn": ArmnnSection}


class Compiled:
    """One executable in the worker with its output block."""

    def __init__(self, exe: Executable) -> None:
        self.exe = exe
        self.out = OwnedBlock()


class TensorWorker:
    """The serving loop of one tensor worker."""

    def __init__(self, conn: Connection, backend_name: str) -> None:
        self.conn = conn
        self.backend_name = backend_name
        self.backend: Backend | None = None
        self.send_lock = threading.Lock()
        self.compiled: dict[int, Compiled] = {}
        self.inputs = AttachedBlocks()

    def send(self, msg: tuple[Any, ...]) -> None:
        with self.send_lock:
            self.conn.send(msg)

    def open(self, options: dict[str, Any]) -> None:
        section = SECTIONS[self.backend_name](**(options.get("settings") or {}))
        backend = load_backend(self.backend_name, section)
        if options.get("cache_dir") and hasattr(backend, "cache_dir"):
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

    def handle(self, kind: str, rid: int, args: tuple[Any, ...]) -> None:
        try:
            if kind == "compile":
                value: Any = self.compile(*args)
            elif kind == "run":
                value = self.run(*args)
            elif kind == "release":
                self.release(*args)
                value = None
            else:
                raise BackendError(f"unknown worker request {kind!r}")
            self.send(("result", rid, value))
        except Exception as exc:
            self.send(("error", rid, error_data(exc)))

    def serve(self) -> int:
        """Read messages until the daemon closes the connection; 0 on a clean close."""
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                break  # the daemon went away: nothing left to serve
            kind = msg[0]
            if kind == "open":
                try:
                    self.open(msg[1])
                except Exception as exc:
                    self.send(("failed", error_data(exc)))
                    return 1
            elif kind == "close":
                break
            else:
                # in this thread, one request at a time: handing each run to another thread
                # costs more than the run of a small model (~200 us per call on a loaded
                # 2-core board); the daemon holds one device per request anyway, and a model's
                # executables on two devices of one runtime then take turns here
                self.handle(kind, msg[1], msg[2:])
        for xid in list(self.compiled):
            self.release(xid)
        return 0


def main(fd: int, backend_name: str) -> int:
    """Serve the connection on ``fd`` (inherited from the daemon) until it closes."""
    # the daemon's Ctrl-C reaches the whole process group: the daemon decides when we stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = TensorWorker(Connection(fd), backend_name)
    rc = 1
    try:
        rc = worker.serve()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
