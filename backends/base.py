"""The one small contract every inference runtime sits behind.

``Target = (backend, device, precision)``, e.g. ``onnxruntime/cpu/fp32``. A backend answers four
questions and nothing else: which targets exist here (:meth:`Backend.probe`), can a target run a
segment without silent fallback (:meth:`Backend.supports`), compile a segment for a target
(:meth:`Backend.compile`), and run it (:meth:`Executable.run`, numpy in, numpy out).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgepilot.errors import BackendError

ModelKind = Literal["gguf", "onnx", "tflite"]


class BackendUnavailable(BackendError):
    """The runtime is not installed or cannot start here; ``doctor`` reports it, nothing breaks."""

    code = "backend_unavailable"


@dataclass(frozen=True, order=True)
class Target:
    """Where a segment runs: runtime, device on that runtime, numeric precision."""

    backend: str
    device: str
    precision: str

    def __str__(self) -> str:
        return f"{self.backend}/{self.device}/{self.precision}"

    @classmethod
    def parse(cls, text: str) -> Target:
        parts = text.split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"target {text!r} must be 'backend/device/precision', "
                             "e.g. 'onnxruntime/cpu/fp32'")
        return cls(*parts)


@dataclass(frozen=True)
class Segment:
    """A contiguous piece of a model to compile as one unit.

    ``inputs``/``outputs`` are the tensor names crossing its boundary; for the whole model they
    are the model's own inputs and outputs. ``layers`` is the half-open range of partitioner
    layer indices it covers (``None`` = the whole model).
    """

    model_path: Path
    kind: ModelKind
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    layers: tuple[int, int] | None = None
    name: str = ""

    @property
    def is_whole(self) -> bool:
        return self.layers is None


@dataclass
class Support:
    """Answer of :meth:`Backend.supports`; ``reason`` says why not (shown by plan/doctor)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int | str | None, ...]


class Executable(ABC):
    """A compiled, warm segment on one target."""

    target: Target
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    # requests that may run inside it at once (llama.cpp's parallel sequences); 1 means the
    # serving layer holds the device for the whole call
    max_concurrency: int = 1
    # set by the serving layer on executables that run several requests at once: entered
    # around each native step, so other work on the same device interleaves between steps
    step_guard: Callable[[], AbstractContextManager[None]] | None = None

    @abstractmethod
    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; numpy arrays keyed by tensor name in, the same out."""

    @property
    def memory_bytes(self) -> int:
        """Resident footprint estimate (weights + arena) for memory budgets."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release native resources."""


@dataclass
class BackendInfo:
    """What ``probe`` found, for doctor/status."""

    name: str
    available: bool
    version: str | None = None
    targets: list[Target] = field(default_factory=list)
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)


class Backend(ABC):
    """One inference runtime. Vendor SDKs are imported inside the backend module only."""

    name: str = ""

    @abstractmethod
    def probe(self) -> list[Target]:
        """Targets on this board; raise BackendUnavailable when the runtime is missing."""

    @abstractmethod
    def supports(self, segment: Segment, target: Target) -> Support:
        """True only if ``target`` runs every op of ``segment`` (no silent CPU fallback)."""

    @abstractmethod
    def compile(self, segment: Segment, target: Target) -> Executable:
        """Build a warm executable; raise BackendError with the runtime's reason on failure."""

    def version(self) -> str | None:
        return None
