"""Shared helpers for the dispatcher tests: generated models and a hookable backend wrapper.

:class:`HookedBackend` is a real backend (it runs onnxruntime underneath) presented under another
name, whose executables can be slowed down or made to raise while a test runs: that is how the
tests slow one target mid-run and make a target fail.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgepilot.backends.base import Backend, Executable, Segment, Support, Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.errors import BackendError
from edgepilot.formats import onnx_gen


class HookedExecutable(Executable):
    def __init__(self, inner: Executable, target: Target, owner: HookedBackend) -> None:
        self.inner = inner
        self.target = target
        self.owner = owner
        self.inputs = inner.inputs
        self.outputs = inner.outputs

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.owner.calls += 1
        if self.owner.fault:
            self.owner.calls_failed += 1
            raise RuntimeError("injected device fault")
        if self.owner.delay_s:
            time.sleep(self.owner.delay_s)
        return self.inner.run(inputs)

    @property
    def memory_bytes(self) -> int:
        return self.inner.memory_bytes


class HookedBackend(Backend):
    """``hooked/cpu/<precision>``: onnxruntime CPU with a delay and a fault switch."""

    name = "hooked"

    def __init__(self, inner: OnnxRuntimeBackend, precisions: tuple[str, ...] = ("int8",)) -> None:
        self.inner = inner
        self.precisions = precisions
        self.delay_s = 0.0
        self.fault = False
        self.calls = 0
        self.calls_failed = 0

    def _inner_target(self, target: Target) -> Target:
        if target.backend != self.name:
            raise BackendError(f"{target} is not a hooked target", field="target")
        return Target("onnxruntime", target.device, target.precision)

    def probe(self) -> list[Target]:
        return [Target(self.name, "cpu", p) for p in self.precisions]

    def supports(self, segment: Segment, target: Target) -> Support:
        return self.inner.supports(segment, self._inner_target(target))

    def compile(self, segment: Segment, target: Target) -> Executable:
        return HookedExecutable(self.inner.compile(segment, self._inner_target(target)),
                                target, self)

    def version(self) -> str | None:
        return "test-1"


@pytest.fixture
def ort_backend(tmp_path: Path) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(cache_dir=tmp_path / "ort-cache")


@pytest.fixture
def mlp_path(tmp_path: Path) -> Path:
    """An MLP where int8 is several times faster than fp32 with ~3% error."""
    path = tmp_path / "models" / "mlp.onnx"
    onnx_gen.mlp_stack(path, widths=(256, 1024, 1024, 1024, 256), batch=8)
    return path


@pytest.fixture
def transformer_path(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tf.onnx"
    onnx_gen.transformer_stack(path, n_blocks=2, d_model=64, seq=16, ffn_small=32,
                               ffn_large=256)
    return path


class Events:
    """Collects emitted events like the daemon's EventBus would deliver them."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def __call__(self, kind: str, **fields: Any) -> None:
        self.items.append({"type": kind, **fields})

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.items if e["type"] == kind]
