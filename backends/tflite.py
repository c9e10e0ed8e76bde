"""TFLite through ai_edge_litert (fallback tflite_runtime): XNNPACK, plain CPU, external delegates.

Devices: ``xnnpack`` (the runtime's default delegate), ``cpu`` (builtin kernels, no default
delegate) and one device per ``[backends.tflite] delegates`` entry (name -> .so, e.g. the Arm NN
delegate or a vendor NPU delegate). Precision is the file's own: ``int8`` for a model with
quantized inputs, else ``fp32``. A segment is cut out of the flatbuffer
(:mod:`edgepilot.models.tflite_graph`), so any operator range can run on its own.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from edgepilot.backends.base import (
    Backend,
    BackendUnavailable,
    Executable,
    Segment,
    Support,
    Target,
    TensorSpec,
)
from edgepilot.config import TfliteSection
from edgepilot.errors import BackendError
from edgepilot.models import tflite_graph

log = logging.getLogger(__name__)

BUILTIN_DEVICES = ("xnnpack", "cpu")


def _interpreter_module() -> Any:
    try:
        from ai_edge_litert import interpreter
    except ImportError:
        try:
            from tflite_runtime import interpreter  # type: ignore[no-redef]
        except ImportError:
            raise BackendUnavailable(
                "neither ai_edge_litert nor tflite_runtime is installed; "
                "pip install 'edgepilot[tflite]'") from None
    return interpreter


def file_precision(path: Path) -> str:
    return "int8" if tflite_graph.is_quantized(path) else "fp32"


class TfliteExecutable(Executable):
    """One warm interpreter; calls are serialised (an interpreter is not re-entrant)."""

    def __init__(self, interp: Any, target: Target, model_bytes: int) -> None:
        self.interp = interp
        self.target = target
        self._bytes = model_bytes
        self._lock = threading.Lock()
        self._in = {d["name"]: d for d in interp.get_input_details()}
        self._out = {d["name"]: d for d in interp.get_output_details()}
        self.inputs = [TensorSpec(n, np.dtype(d["dtype"]).name, tuple(
            int(x) for x in d["shape"])) for n, d in self._in.items()]
        self.outputs = [TensorSpec(n, np.dtype(d["dtype"]).name, tuple(
            int(x) for x in d["shape"])) for n, d in self._out.items()]

    @property
    def memory_bytes(self) -> int:
        return self._bytes

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = sorted(set(self._in) - set(inputs))
        if missing:
            raise BackendError(f"missing input(s) {missing}; this segment takes "
                               f"{sorted(self._in)}", field=f"inputs.{missing[0]}")
        with self._lock:
            for name, detail in self._in.items():
                try:
                    self.interp.set_tensor(detail["index"], inputs[name])
                except ValueError as exc:
                    raise BackendError(f"input {name!r}: {exc}", field=f"inputs.{name}") from None
            self.interp.invoke()
            return {n: np.array(self.interp.get_tensor(d["index"])) for n, d in self._out.items()}


class TfliteBackend(Backend):
    """TFLite interpreter targets; external delegates are loaded by path from config."""

    name = "tflite"

    def __init__(self, settings: TfliteSection | None = None) -> None:
        self.settings = settings or TfliteSection()

    def version(self) -> str | None:
        try:
            import ai_edge_litert

            return str(getattr(ai_edge_litert, "__version__", "ai_edge_litert"))
        except ImportError:
            return "tflite_runtime"

    def devices(self) -> list[str]:
        _interpreter_module()
        extra = [n for n, p in self.settings.delegates.items() if Path(p).is_file()]
        for name, p in self.settings.delegates.items():
            if name not in extra:
                log.warning("tflite delegate %s: %s does not exist; device skipped", name, p)
        return [*BUILTIN_DEVICES, *extra]

    def probe(self) -> list[Target]:
        return [Target(self.name, d, p) for d in self.devices() for p in ("fp32", "int8")]

    def supports(self, segment: Segment, target: Target) -> Support:
        if segment.kind != "tflite":
            return Support(False, f"the TFLite backend runs .tflite files, not {segment.kind}")
        if target.device not in BUILTIN_DEVICES and target.device not in self.settings.delegates:
            return Support(False, f"unknown TFLite device {target.device!r}; configured: "
                                  f"{', '.join([*BUILTIN_DEVICES, *self.settings.delegates])}")
        precision = file_precision(segment.model_path)
        if target.precision != precision:
            return Support(False, f"the file's tensors are {precision}; TFLite runs a file in "
                                  f"its own types, not {target.precision}")
        if target.device in self.settings.delegates:
            so = self.settings.delegates[target.device]
            if not Path(so).is_file():
                return Support(False, f"delegate library {so} does not exist")
        return Support(True)

    def model_bytes(self, segment: Segment) -> bytes:
        """The flatbuffer to load: the file itself, or the segment cut out of it."""
        if segment.is_whole:
            return segment.model_path.read_bytes()
        return tflite_graph.cut(segment.model_path, segment.inputs, segment.outputs)

    def compile(self, segment: Segment, target: Target) -> Executable:
        support = self.supports(segment, target)
        if not support:
            raise BackendError(f"{target} cannot run {segment.model_path.name}: {support.reason}")
        mod = _interpreter_module()
        content = self.model_bytes(segment)
        kwargs: dict[str, Any] = {"model_content": content}
        if self.settings.threads:
            kwargs["num_threads"] = self.settings.threads
        if target.device == "cpu":
            kwargs["experimental_op_resolver_type"] = (
                mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        elif target.device != "xnnpack":
            so = self.settings.delegates[target.device]
            try:
                kwargs["experimental_delegates"] = [mod.load_delegate(str(so))]
            except (ValueError, OSError) as exc:
                raise BackendError(f"could not load TFLite delegate {so}: {exc}",
                                   field=f"backends.tflite.delegates.{target.device}") from None
            # a delegate that takes only part of the graph silently leaves the rest on CPU
            kwargs["experimental_op_resolver_type"] = (
                mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        try:
            interp = mod.Interpreter(**kwargs)
            interp.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            raise BackendError(f"TFLite could not build {segment.model_path.name} on {target}: "
                               f"{exc}") from None
        return TfliteExecutable(interp, target, len(content))
