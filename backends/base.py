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
from dataclasses import dataclass

import numpy as np

from edgepilot.errors import BackendError
from edgepilot.formats.spec import ModelKind, Segment, TensorSpec

# The model-side types live in formats (below backends); re-exported as the backend contract.
__all__ = ["Backend", "BackendUnavailable", "Executable", "ModelKind", "Segment", "Support",
           "Target", "TensorSpec"]

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


@dataclass
class Support:
    """Answer of :meth:`Backend.supports`; ``reason`` says why not (shown by plan/doctor)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


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
