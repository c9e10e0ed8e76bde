"""Inference backends, loaded lazily by name so a missing runtime breaks nothing else."""

from __future__ import annotations

import importlib

from edgepilot.backends.base import Backend, BackendOptions, BackendUnavailable

# name -> "module:Class"; the module imports its runtime only when the class is built
BACKENDS: dict[str, str] = {
    "onnxruntime": "edgepilot.backends.onnxrt:OnnxRuntimeBackend",
    "tflite": "edgepilot.backends.tflite:TfliteBackend",
    "armnn": "edgepilot.backends.armnn:ArmnnBackend",
    "llamacpp": "edgepilot.backends.llamacpp.backend:LlamaCppBackend",
}


def backend_class(name: str) -> type[Backend]:
    """The class of backend ``name`` (importing its module, not its runtime);
    BackendUnavailable for an unknown name or a module that cannot be imported."""
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
    cls: type[Backend] = getattr(module, clsname)
    return cls


def load_backend(name: str, settings: BackendOptions | None = None) -> Backend:
    """Instantiate backend ``name`` with its section (its ``options_class``; None: the
    defaults); BackendUnavailable if missing."""
    cls = backend_class(name)
    if settings is not None and not isinstance(settings, cls.options_class):
        raise TypeError(f"backend {name!r} takes {cls.options_class.__name__}, "
                        f"not {type(settings).__name__}")
    return cls(settings) if settings is not None else cls()  # type: ignore[call-arg]
