"""Shared by the tensor-isolation tests: generated models, the runtimes in and out of a worker,
and small waits (bounds for things that happen, never speed checks)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgepilot.backends.armnn import ArmnnBackend
from edgepilot.backends.armnn_options import ArmnnSection
from edgepilot.backends.backend_set import BackendSet
from edgepilot.backends.base import Backend, Segment, Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.backends.onnxrt_options import OnnxRuntimeSection
from edgepilot.backends.tflite import TfliteBackend
from edgepilot.backends.tflite_options import TfliteSection
from edgepilot.backends.workers.tensor_process import IsolatedBackend
from edgepilot.formats import onnx_gen, tflite_graph
from edgepilot.formats.tflite_gen import write_mlp_tflite

WAIT_S = 60.0  # a bound for things that happen (a worker noticed dead), never a speed check
Events = list[tuple[str, dict[str, Any]]]


def wait_until(cond: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Segment]:
    root = tmp_path_factory.mktemp("iso")
    onnx_path = root / "mlp.onnx"
    onnx_gen.mlp_stack(onnx_path, widths=(64, 256, 64), batch=2)
    tfl_path = write_mlp_tflite(root / "mlp_tfl.tflite", width=32, depth=3, batch=2)
    ins, outs = tflite_graph.io_names(tfl_path)
    return {"onnxruntime": Segment(onnx_path, "onnx", ("x",), ("y",), None, "demo-mlp"),
            "tflite": Segment(tfl_path, "tflite", ins, outs, None, "demo-tfl"),
            "armnn": Segment(tfl_path, "tflite", ins, outs, None, "demo-armnn")}


SECTIONS: dict[str, Any] = {"onnxruntime": OnnxRuntimeSection, "tflite": TfliteSection,
                            "armnn": ArmnnSection}
TARGETS = {"onnxruntime": Target("onnxruntime", "cpu", "fp32"),
           "tflite": Target("tflite", "cpu", "fp32"), "armnn": Target("armnn", "CpuRef", "fp32")}


def backends(name: str, isolation: str) -> Backend:
    """The runtime in this process (``isolation`` is only carried)."""
    section = SECTIONS[name](isolation=isolation)
    if name == "onnxruntime":
        return OnnxRuntimeBackend(section)
    return TfliteBackend(section) if name == "tflite" else ArmnnBackend(section)


def feeds(segment: Segment, seed: int = 0) -> dict[str, np.ndarray]:
    exe = backends(cpu(segment).backend, "thread").compile(segment, cpu(segment))
    rng = np.random.default_rng(seed)
    return {s.name: rng.standard_normal([int(d or 1) for d in s.shape]).astype(s.dtype)
            for s in exe.inputs}


def cpu(segment: Segment) -> Target:
    backend = "onnxruntime" if segment.kind == "onnx" else "tflite"
    return Target(backend, "cpu", "fp32")


def isolated(name: str, events: Events) -> IsolatedBackend:
    """The backend as BackendSet builds it from ``isolation = "process"``."""
    section = SECTIONS[name](isolation="process")
    bset = BackendSet(lambda n: section if n == name else None, [name])
    bset.emit = lambda kind, **fields: events.append((kind, fields))
    backend = bset.get(name)
    assert isinstance(backend, IsolatedBackend)
    return backend


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
