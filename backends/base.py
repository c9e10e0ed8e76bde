"""The one small contract every inference runtime sits behind.

``Target = (backend, device, precision)``, e.g. ``onnxruntime/cpu/fp32``. A backend answers four
questions and nothing else: which targets exist here (:meth:`Backend.probe`), can a target run a
segment without silent fallback (:meth:`Backend.supports`), compile a segment for a target
(:meth:`Backend.compile`), and run it (:meth:`Executable.run`, numpy in, numpy out).

Each backend declares its config section (:attr:`Backend.options_class`, a
:class:`~edgepilot.backends.options.BackendOptions`), which says where its models run
(:attr:`Backend.isolation`); an executable in a worker process names it
(:attr:`Executable.worker_pid`). A language model is a :class:`GenerativeExecutable`: chat and
text completion, and embeddings where the model can (:attr:`GenerativeExecutable.can_embed`).
"""

from __future__ import annotations

import concurrent.futures
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgepilot.backends.options import BackendOptions, Isolation
from edgepilot.errors import BackendError, CommandError
from edgepilot.formats.spec import ModelKind, Segment, TensorSpec

# The model-side types live in formats (below backends); re-exported as the backend contract.
__all__ = ["Backend", "BackendOptions", "BackendUnavailable", "EmbeddingsUnsupported",
           "Executable", "GenerativeExecutable", "Isolation", "ModelKind", "Segment", "Support",
           "Target", "TensorSpec"]

class BackendUnavailable(BackendError):
    """The runtime is not installed or cannot start here; ``doctor`` reports it, nothing breaks."""

    code = "backend_unavailable"


class EmbeddingsUnsupported(CommandError):
    """The model cannot compute embeddings (a request error: ask another model)."""

    code = "embeddings_unsupported"


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

    # where its load time went, in ms (llama.cpp: worker_start_ms, model_ms, context_ms), for
    # the model.loaded event; None: not measured
    load_split: dict[str, float] | None = None

    @property
    def worker_pid(self) -> int | None:
        """The worker process it runs in (``isolation = "process"``); None: in this one."""
        return None

    def reset_state(self) -> None:  # noqa: B027 - optional hook
        """Forget what a run left for the next one (a TFLite model's variable tensors, an
        LSTM's state kept between invokes): run on from here as if freshly built."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release native resources."""


class GenerativeExecutable(Executable):
    """A loaded language model: chat and text completion (and embeddings where it can), in
    llama-cpp-python's OpenAI shapes. ``stream=True`` in ``params`` answers an iterator of
    chunks (with a ``usage`` once exhausted); setting ``cancel`` ends a generation at its next
    token."""

    n_ctx: int
    # whether :meth:`embed` works: a model loaded for generation may not embed
    can_embed: bool = False

    @abstractmethod
    def chat(self, messages: list[dict[str, Any]], *, cancel: threading.Event | None = None,
             **params: Any) -> Any:
        """A chat completion of ``messages``."""

    @abstractmethod
    def complete(self, prompt: str, *, cancel: threading.Event | None = None,
                 **params: Any) -> Any:
        """A text completion of ``prompt``."""

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """The model's tokens of ``text``."""

    def embed(self, texts: Sequence[str], truncate: bool = True) -> list[list[float]]:
        """One vector per text; EmbeddingsUnsupported when the model cannot embed.
        ``truncate`` False: a text longer than the model takes is a ContextOverflow."""
        raise EmbeddingsUnsupported(f"model on {self.target} cannot compute embeddings",
                                    field="model")

    @property
    def executor(self) -> concurrent.futures.Executor | None:
        """Where its calls should run when it runs one at a time (None: anywhere)."""
        return None

    def set_threads(self, n_threads: int) -> None:
        """Run with ``n_threads`` from the next request on (where the runtime can)."""


class Backend(ABC):
    """One inference runtime. Vendor SDKs are imported inside the backend module only."""

    name: str = ""
    # its ``[backends.<name>]`` section
    options_class: ClassVar[type[BackendOptions]] = BackendOptions
    settings: BackendOptions
    # where it keeps what it derives from model files across restarts (quantized variants,
    # cut segments); None: in memory only
    cache_dir: Path | None = None

    @property
    def isolation(self) -> Isolation:
        """Where its compiled models run (its section's ``isolation``)."""
        return self.settings.isolation

    def start_spares(self) -> None:  # noqa: B027 - optional hook
        """Start what makes the next load cheaper (llama.cpp: a spare worker process); the
        daemon calls it once ready."""

    def close_spares(self) -> None:  # noqa: B027 - optional hook
        """End what :meth:`start_spares` started."""

    @abstractmethod
    def probe(self) -> list[Target]:
        """Targets on this board; raise BackendUnavailable when the runtime is missing."""

    @abstractmethod
    def supports(self, segment: Segment, target: Target) -> Support:
        """True only if ``target`` runs every op of ``segment`` (no silent CPU fallback)."""

    def takes(self, kind: ModelKind) -> bool:
        """Whether any segment of a ``kind`` model can be supported (False: ``supports`` is
        False for all of them, and the planner asks about none)."""
        return True

    @abstractmethod
    def compile(self, segment: Segment, target: Target) -> Executable:
        """Build a warm executable; raise BackendError with the runtime's reason on failure."""

    def version(self) -> str | None:
        return None
