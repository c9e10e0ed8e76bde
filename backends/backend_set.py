"""The backends of one daemon: one instance per runtime, built on first use with its options.

The registry (whole models), the dispatcher (plan segments) and the GGUF planner all take their
backend from here, so a runtime's caches, thread pools and contexts exist once per process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgepilot.backends import BACKENDS, load_backend
from edgepilot.backends.base import Backend, BackendOptions, BackendUnavailable
from edgepilot.backends.workers.tensor_process import IsolatedBackend
from edgepilot.errors import EdgepilotError

# tensor backends only: llama.cpp plans GGUF models by n_gpu_layers, not per layer
TENSOR_BACKENDS = ("onnxruntime", "tflite", "armnn")


class BackendSet:
    """Backends by name. ``options(name)`` gives a backend's section (its ``options_class``;
    None: the defaults); ``enabled`` limits which may load (None: all installed)."""

    def __init__(self, options: Callable[[str], BackendOptions | None], enabled: list[str] | None,
                 cache_dir: Path | None = None, *,
                 emit: Callable[..., object] | None = None) -> None:
        """``emit``: where worker faults and restarts of isolated tensor backends are reported
        (the daemon's event bus)."""
        self.options = options
        self.enabled = enabled
        self.cache_dir = cache_dir
        self.emit = emit
        self._built: dict[str, Backend | None] = {}
        self._errors: dict[str, str] = {}
        self._lock = threading.Lock()

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.emit is not None:
            self.emit(kind, **fields)

    def get(self, name: str) -> Backend:
        """Backend ``name``; BackendUnavailable (with the reason) when disabled or missing."""
        with self._lock:
            if name not in self._built:
                try:
                    if self.enabled is not None and name not in self.enabled:
                        raise BackendUnavailable(f"backend {name!r} is not in [backends] enabled")
                    backend = load_backend(name, self.options(name))
                    if self.cache_dir is not None:
                        # quantized variants and cut segments survive restarts in the state dir
                        backend.cache_dir = self.cache_dir / name
                    if name in TENSOR_BACKENDS and backend.isolation == "process":
                        # executables in worker processes: a native crash costs only the
                        # requests on that model (llama.cpp isolates itself: open_served)
                        backend = IsolatedBackend(backend, backend.settings, self._emit)
                    self._built[name] = backend
                except BackendUnavailable as exc:
                    self._built[name] = None
                    self._errors[name] = exc.message
            built = self._built[name]
        if built is None:
            raise BackendUnavailable(self._errors[name], field="backend")
        return built

    def names(self) -> list[str]:
        """Installed, enabled backends."""
        out = []
        for name in BACKENDS:
            try:
                self.get(name)
                out.append(name)
            except BackendUnavailable:
                continue
        return out

    def tensor(self, on_skip: Callable[[str, str], None] | None = None) -> dict[str, Backend]:
        """Every enabled, installed tensor backend whose probe works (the dispatcher's)."""
        out: dict[str, Backend] = {}
        for name in TENSOR_BACKENDS:
            try:
                backend = self.get(name)
                backend.probe()
            except EdgepilotError as exc:
                if on_skip is not None:
                    on_skip(name, exc.message)
                continue
            out[name] = backend
        return out

    def start_spares(self, kinds: set[str]) -> None:
        """Start what makes the next load of a model of these kinds cheaper (llama.cpp's spare
        worker process for "gguf"); the daemon calls it once ready."""
        if "gguf" not in kinds:
            return
        try:
            backend = self.get("llamacpp")
        except BackendUnavailable:
            return
        backend.start_spares()

    def close_spares(self) -> None:
        """End every spare (a stopping daemon, a reloaded config)."""
        with self._lock:
            built = [b for b in self._built.values() if b is not None]
        for backend in built:
            backend.close_spares()

    def reset(self, options: Callable[[str], BackendOptions | None],
              enabled: list[str] | None) -> None:
        """New options (a reloaded config): instances are built again on next use (their
        spares end now)."""
        self.close_spares()
        with self._lock:
            self.options, self.enabled = options, enabled
            # an isolated backend's workers end with their last executable, not here
            self._built.clear()
            self._errors.clear()
