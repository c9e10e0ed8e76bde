"""Arm NN through pyarmnn: TfLite parser (ONNX parser where the build has one).

Devices are Arm NN compute backends (``CpuAcc``, ``GpuAcc``, ``CpuRef``) in the configured
preference order, limited to those the runtime registered. ``fp16`` targets set
reduce-fp32-to-fp16; ``int8`` targets run a quantized file in its own types. Arm NN has no INT4
in any release. Segments are cut out of the TFLite flatbuffer like for the TFLite backend.

There is ONE ``IRuntime`` per process, shared by every network: creating a second runtime
unregisters the reference backend (CpuRef) from the first one in Arm NN 2x, so the runtime is
deliberately a process-wide object behind a lock rather than per backend instance.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from edgepilot.backends.armnn_options import ArmnnSection
from edgepilot.backends.base import (
    Backend,
    BackendUnavailable,
    Executable,
    ModelKind,
    Segment,
    Support,
    Target,
    TensorSpec,
)
from edgepilot.backends.child_check import crash
from edgepilot.errors import BackendError
from edgepilot.formats import tflite_graph

log = logging.getLogger(__name__)

_runtime_lock = threading.Lock()
_runtime: Any = None

# Arm NN DataType names -> numpy dtype names
# the custom operators Arm NN's TFLite parser implements (TfLiteParser.cpp: the SSD post-process)
PARSER_CUSTOM_OPS = frozenset({"TFLite_Detection_PostProcess"})
# operator inputs Arm NN's TFLite parser reads as constants from the file's buffers (block
# shapes, paddings, axes, permutations, sizes): one computed at run time (a segment cut after its
# producer, a block shape derived from SHAPE) is an empty buffer, and the parser copies from it
# and segfaults (SPACE_TO_BATCH_ND of a dilated convolution's cut took the daemon down)
PARSER_CONSTANT_INPUTS: dict[str, tuple[int, ...]] = {
    "SPACE_TO_BATCH_ND": (1, 2), "BATCH_TO_SPACE_ND": (1, 2), "PAD": (1,), "PADV2": (1, 2),
    "MIRROR_PAD": (1,), "MEAN": (1,), "SUM": (1,), "REDUCE_MAX": (1,), "REDUCE_MIN": (1,),
    "REDUCE_PROD": (1,), "TRANSPOSE": (1,), "SLICE": (1, 2), "STRIDED_SLICE": (1, 2, 3),
    "TILE": (1,), "RESIZE_BILINEAR": (1,), "RESIZE_NEAREST_NEIGHBOR": (1,), "EXPAND_DIMS": (1,),
    "SPLIT": (0,), "SPLIT_V": (1, 2), "ARG_MAX": (1,), "ARG_MIN": (1,),
}
# the whole file built for one target as _build does, in a child process first: Arm NN asserts
# on some files (reducing a float file with per-channel int8 weights to fp16 aborts in
# GetQuantizationScale), and an assert is a SIGABRT that ends the daemon (see child_check)
_CHILD = """
import sys
import pyarmnn as ann
path, device, precision = sys.argv[1:4]
try:
    parser = ann.ITfLiteParser()
    network = parser.CreateNetworkFromBinaryFile(path)
    options = ann.OptimizerOptions()
    options.m_ReduceFp32ToFp16 = precision == "fp16"
    rt = ann.IRuntime(ann.CreationOptions())
    optimized, _ = ann.Optimize(network, [ann.BackendId(device)], rt.GetDeviceSpec(), options)
    rt.LoadNetwork(optimized)
except Exception:
    pass
"""
_DTYPES = {"Float32": "float32", "Float16": "float16", "QAsymmU8": "uint8",
           "QAsymmS8": "int8", "QSymmS8": "int8", "Signed32": "int32", "Boolean": "bool",
           "QSymmS16": "int16", "Signed64": "int64"}


class _WorkloadChatter(logging.Filter):
    """pyarmnn logs every input and output tensor's shape (``Workload tensor 0 shape: ...``)
    through ``logging.info``, i.e. on the root logger, where no level of its own can be set:
    this filter, on the root logger, drops the root's records below WARNING that come from
    pyarmnn's files. Records of named loggers (the daemon's own) only pass through the root's
    handlers, never its filters, so they are untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "root" and record.levelno < logging.WARNING
                    and f"{os.sep}pyarmnn{os.sep}" in record.pathname)


_CHATTER = _WorkloadChatter()


def _ann() -> Any:
    # pyarmnn warns at import about every parser its build lacks (Caffe, ONNX, TF on Debian's);
    # only the TfLite parser is used here and probe() reports what is missing, so keep the
    # operator's log for things that need action.
    logging.getLogger("pyarmnn").setLevel(logging.ERROR)
    if _CHATTER not in logging.getLogger().filters:
        logging.getLogger().addFilter(_CHATTER)
    try:
        import pyarmnn
    except ImportError as exc:
        raise BackendUnavailable(
            f"pyarmnn is not importable ({exc}); install Debian's python3-pyarmnn and run "
            "scripts/link-pyarmnn.sh") from None
    return pyarmnn


def runtime() -> Any:
    """The process-wide Arm NN runtime, created on first use."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            ann = _ann()
            _runtime = ann.IRuntime(ann.CreationOptions())
        return _runtime


def _dtype_name(ann: Any, dt: int) -> str:
    for name, np_name in _DTYPES.items():
        if getattr(ann, f"DataType_{name}", None) == dt:
            return np_name
    return f"armnn:{dt}"


def _dims(spec: TensorSpec) -> tuple[int, ...]:
    """An Arm NN tensor's dims (always fixed: see :func:`_spec`)."""
    return tuple(d for d in spec.shape if isinstance(d, int))


def _spec(ann: Any, name: str, info: Any) -> TensorSpec:
    shape = info.GetShape()
    return TensorSpec(name, _dtype_name(ann, info.GetDataType()),
                      tuple(int(shape[i]) for i in range(info.GetNumDimensions())))


class ArmnnExecutable(Executable):
    """A network loaded into the shared runtime; runs are serialised per network."""

    def __init__(self, net_id: int, in_bind: list[tuple[str, Any]],
                 out_bind: list[tuple[str, Any]], target: Target, model_bytes: int) -> None:
        ann = _ann()
        self.net_id = net_id
        self.target = target
        self._in = in_bind
        self._out = out_bind
        self._bytes = model_bytes
        self._lock = threading.Lock()
        self.inputs = [_spec(ann, n, b[1]) for n, b in in_bind]
        self.outputs = [_spec(ann, n, b[1]) for n, b in out_bind]

    @property
    def memory_bytes(self) -> int:
        return self._bytes

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ann = _ann()
        missing = sorted({n for n, _ in self._in} - set(inputs))
        if missing:
            raise BackendError(f"missing input(s) {missing}", field=f"inputs.{missing[0]}")
        arrays = []
        for (name, _), spec in zip(self._in, self.inputs, strict=True):
            arr = np.ascontiguousarray(inputs[name], dtype=spec.dtype)
            if arr.size != int(np.prod(_dims(spec))):
                raise BackendError(f"input {name!r} has {arr.size} elements; Arm NN network "
                                   f"wants shape {list(spec.shape)}", field=f"inputs.{name}")
            arrays.append(arr)
        with self._lock:
            in_t = ann.make_input_tensors([b for _, b in self._in], arrays)
            out_t = ann.make_output_tensors([b for _, b in self._out])
            runtime().EnqueueWorkload(self.net_id, in_t, out_t)
            results = ann.workload_tensors_to_ndarray(out_t)
        return {n: np.array(r).reshape(_dims(s))
                for (n, _), r, s in zip(self._out, results, self.outputs, strict=True)}

    def close(self) -> None:
        with self._lock:
            if self.net_id is not None:
                runtime().UnloadNetwork(self.net_id)
                self.net_id = None  # type: ignore[assignment]


class ArmnnBackend(Backend):
    """Arm NN compute backends as devices, TFLite files (segments cut from the flatbuffer)."""

    name = "armnn"
    options_class = ArmnnSection
    settings: ArmnnSection

    def __init__(self, settings: ArmnnSection | None = None) -> None:
        self.settings = settings or ArmnnSection()

    def version(self) -> str | None:
        return str(getattr(_ann(), "ARMNN_VERSION", "unknown"))

    def devices(self) -> list[str]:
        """Configured preference order, limited to backends this runtime registered."""
        registered = {str(b) for b in runtime().GetDeviceSpec().GetSupportedBackends()}
        return [d for d in self.settings.preferred if d in registered]

    def probe(self) -> list[Target]:
        return [Target(self.name, d, p) for d in self.devices() for p in ("fp32", "fp16", "int8")]

    def takes(self, kind: ModelKind) -> bool:
        return kind == "tflite"

    def supports(self, segment: Segment, target: Target) -> Support:
        if segment.kind == "onnx":
            if not hasattr(_ann(), "IOnnxParser"):
                return Support(False, "this Arm NN build has no ONNX parser")
            return Support(False, "ONNX models run through the onnxruntime ArmNN/ACL providers")
        if segment.kind != "tflite":
            return Support(False, f"Arm NN cannot parse {segment.kind} files")
        if target.device not in self.devices():
            return Support(False, f"Arm NN backend {target.device!r} is not registered here; "
                                  f"available: {', '.join(self.devices()) or 'none'}")
        quantized = tflite_graph.is_quantized(segment.model_path)
        if (target.precision == "int8") != quantized:
            return Support(False, f"the file is {'int8' if quantized else 'float'}; "
                                  f"Arm NN target {target.precision} does not match")
        if target.precision not in ("fp32", "fp16", "int8"):
            return Support(False, f"Arm NN precisions are fp32, fp16, int8 (no INT4), "
                                  f"not {target.precision}")
        try:
            self._build(segment, target).close()
        except BackendError as exc:
            return Support(False, exc.message)
        return Support(True)

    def compile(self, segment: Segment, target: Target) -> Executable:
        if segment.kind != "tflite":
            raise BackendError(f"Arm NN here parses TFLite only, not {segment.kind}")
        if target.device not in self.devices():
            raise BackendError(f"Arm NN backend {target.device!r} is not registered; available: "
                               f"{', '.join(self.devices()) or 'none'}",
                               field="backends.armnn.preferred")
        return self._build(segment, target)

    def _build(self, segment: Segment, target: Target) -> ArmnnExecutable:
        ann = _ann()
        if segment.is_whole:
            content = segment.model_path.read_bytes()
        else:
            content = tflite_graph.cut(segment.model_path, segment.inputs, segment.outputs)
        unknown = tflite_graph.custom_ops(content) - PARSER_CUSTOM_OPS
        if unknown:
            # refused before the parser sees them: on some (a precompiled NPU file's
            # DISPATCH_OP) the native parser segfaults and takes the daemon with it
            raise BackendError(f"Arm NN's TFLite parser takes no custom op "
                               f"{', '.join(sorted(unknown))}", field="target")
        computed = tflite_graph.computed_parameters(content, PARSER_CONSTANT_INPUTS)
        if computed:
            raise BackendError(f"Arm NN's TFLite parser needs constant operator parameters; "
                               f"here they are computed at run time ({', '.join(computed[:4])})",
                               field="target")
        died = crash(_CHILD, Path(segment.model_path), target.device, target.precision)
        if died:
            raise BackendError(f"Arm NN crashes building {Path(segment.model_path).name} for "
                               f"{target} ({died}); that target cannot run this file",
                               field="target")
        # the Debian parser reads files only; the cut model goes through a private temp file
        fd, tmp = tempfile.mkstemp(suffix=".tflite", prefix="edgepilot-armnn-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(content)
            parser = ann.ITfLiteParser()
            network = parser.CreateNetworkFromBinaryFile(tmp)
            ins = list(parser.GetSubgraphInputTensorNames(0))
            outs = list(parser.GetSubgraphOutputTensorNames(0))
            in_bind = [(n, parser.GetNetworkInputBindingInfo(0, n)) for n in ins]
            out_bind = [(n, parser.GetNetworkOutputBindingInfo(0, n)) for n in outs]
            options = ann.OptimizerOptions()
            options.m_ReduceFp32ToFp16 = target.precision == "fp16"
            rt = runtime()
            optimized, _messages = ann.Optimize(network, [ann.BackendId(target.device)],
                                                rt.GetDeviceSpec(), options)
            net_id, _ = rt.LoadNetwork(optimized)
        except RuntimeError as exc:
            # pyarmnn raises RuntimeError with the parser's/optimizer's reason
            reason = str(exc).split(" at function ")[0]
            raise BackendError(f"Arm NN cannot run {Path(segment.model_path).name} on {target}: "
                               f"{reason}") from None
        finally:
            os.unlink(tmp)
        return ArmnnExecutable(net_id, in_bind, out_bind, target, len(content))
