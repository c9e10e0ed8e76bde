"""Inference backends, loaded lazily by name so a missing runtime breaks nothing else."""

from __future__ import annotations

import importlib
from typing import Any

from edgepilot.backends.base import Backend, BackendUnavailable

# name -> "module:Class"; the module imports its runtime only when the class is built
BACKENDS: dict[str, str] = {
    "onnxruntime": "edgepilot.backends.onnxrt:OnnxRuntimeBackend",
    "tflite": "edgepilot.backends.tflite:TfliteBackend",
    "armnn": "edgepilot.backends.armnn:ArmnnBackend",
    "llamacpp": "edgepilot.backends.llamacpp.backend:LlamaCppBackend",
}


def load_backend(name: str, settings: Any = None) -> Backend:
    """Instantiate backend ``name`` with its settings section; BackendUnavailable if missing."""
    try:
        spec = BACKENDS[name]
    except KeyError:
        raise BackendUnavailable(
            f"unknown backend {name!r}; allowed: {', '.join(sorted(BACKENDS))}",
            field="backend") from None
    modname, _, clsname = spec.partition(":")
    try:
        module = importlib.import_module(modname)
    except ImportError as exc:
        raise BackendUnavailable(f"backend {name!r} is not installed here: {exc}") from None
    cls = getattr(module, clsname)
    backend: Backend = cls(settings) if settings is not None else cls()
    return backend
