"""ONNX Runtime backend: every available execution provider is a device.

Devices are short provider names (``cpu``, ``xnnpack``, ``qnn``, ``cuda`` ...). Precisions per
device are what that provider actually runs: on ``cpu`` fp32, int8 (dynamic quantization, the
fast int8 path of the CPU EP) and int4 (weight-only ``MatMulNBits``); NPU-style providers get
QDQ int8; GPU providers fp16. ``supports`` builds the session with CPU fallback *disabled* for
any NPU-style device, so "supported" means every node runs there (GPU providers keep their
shape arithmetic on the CPU, as they are built to). A provider onnxruntime lists but cannot load
here (onnxruntime-gpu without a GPU or without TensorRT) is no device: ``unloadable`` says why.

``cpu-1t`` is the CPU provider held to one intra-op thread. onnxruntime's default pool (one
thread per core, idle workers not spinning: see ``allow_spinning``) costs a wake-up and a join
on every operator; on a sub-millisecond streaming model (a VAD, a wake-word head) that is most
of the call, and one thread runs it 1.2-1.3x faster, while a heavier model wants every core.
Which one a model (or a layer) gets is the planner's choice from timings, like any target.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

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
from edgepilot.backends.onnxrt_options import OnnxRuntimeSection, default_threads
from edgepilot.errors import BackendError

log = logging.getLogger(__name__)

# provider -> short device name; Azure is a remote-call EP, never a local device
PROVIDER_DEVICES: dict[str, str] = {
    "CPUExecutionProvider": "cpu",
    "XnnpackExecutionProvider": "xnnpack",
    "QNNExecutionProvider": "qnn",
    "NnapiExecutionProvider": "nnapi",
    "ArmNNExecutionProvider": "armnn",
    "ACLExecutionProvider": "acl",
    "CUDAExecutionProvider": "cuda",
    "TensorrtExecutionProvider": "tensorrt",
    "DnnlExecutionProvider": "dnnl",
    "OpenVINOExecutionProvider": "openvino",
    "CoreMLExecutionProvider": "coreml",
    "RknpuExecutionProvider": "rknpu",
    "WebGpuExecutionProvider": "webgpu",
}
DEVICE_PROVIDERS = {v: k for k, v in PROVIDER_DEVICES.items()}
SINGLE_THREAD = "cpu-1t"
DEVICE_PROVIDERS[SINGLE_THREAD] = "CPUExecutionProvider"
# devices run by the CPU provider: every standard op, so support needs no trial session
CPU_DEVICES = ("cpu", SINGLE_THREAD)
GPU_DEVICES = ("cuda", "tensorrt", "webgpu")

# precision -> variant recipe, per device; devices not listed get fp32 only
DEVICE_PRECISIONS: dict[str, dict[str, str]] = {
    "cpu": {"fp32": "fp32", "int8": "int8-dynamic", "int4": "int4"},
    # int4 is for weight-bound MatMuls, where all cores pay: not offered single-threaded
    SINGLE_THREAD: {"fp32": "fp32", "int8": "int8-dynamic"},
    "xnnpack": {"fp32": "fp32", "int8": "int8-qdq"},
    "qnn": {"int8": "int8-qdq", "fp16": "fp16"},
    "nnapi": {"fp32": "fp32", "int8": "int8-qdq"},
    "armnn": {"fp32": "fp32"},
    "acl": {"fp32": "fp32", "int8": "int8-qdq"},
    # tf32: the fp32 graph with the GPU's TF32 tensor-core math (10-bit mantissa). fp32 is kept
    # exact: onnxruntime's default (TF32 on) put ResNet/CRNN outputs 3e-3 off the CPU's and
    # failed doctor's fp32 check on an H200, and was no faster there at batch 1 (bench/README)
    "cuda": {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16", "int4": "int4"},
    "tensorrt": {"fp32": "fp32", "fp16": "fp16"},
    "dnnl": {"fp32": "fp32", "int8": "int8-dynamic"},
    "openvino": {"fp32": "fp32", "int8": "int8-qdq"},
}

_NP_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16",
             "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8",
             "tensor(uint8)": "uint8", "tensor(bool)": "bool", "tensor(double)": "float64"}


class OrtExecutable(Executable):
    """A warm ``InferenceSession`` for one segment on one target.

    ``model_sha256`` is the digest of the exact model bytes the session was built from: two
    executables with the same digest on the same target are the same session (the planner's
    "an all-one-target plan is exactly the whole model on that runtime" is tested with it).
    """

    def __init__(self, session: Any, target: Target, size_bytes: int,
                 model_sha256: str = "") -> None:
        self._session = session
        self.target = target
        self._size = size_bytes
        self.model_sha256 = model_sha256
        self.inputs = [TensorSpec(i.name, _NP_TYPES.get(i.type, i.type), tuple(i.shape))
                       for i in session.get_inputs()]
        self.outputs = [TensorSpec(o.name, _NP_TYPES.get(o.type, o.type), tuple(o.shape))
                        for o in session.get_outputs()]
        self._in_names = [i.name for i in self.inputs]
        self._out_names = [o.name for o in self.outputs]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            feed = {n: inputs[n] for n in self._in_names}
        except KeyError as exc:
            raise BackendError(f"input tensor {exc.args[0]!r} missing; this segment needs "
                               f"{', '.join(self._in_names)}", field="inputs") from None
        try:
            values = self._session.run(self._out_names, feed)
        except Exception as exc:
            raise BackendError(f"onnxruntime failed on {self.target}: {exc}") from None
        return dict(zip(self._out_names, values, strict=True))

    @property
    def memory_bytes(self) -> int:
        return self._size

    def close(self) -> None:
        self._session = None


class OnnxRuntimeBackend(Backend):
    """``onnxruntime`` with each available execution provider as a device.

    ``settings`` is the ``[backends.onnxruntime]`` section (providers, provider_options,
    intra_op_threads, allow_spinning). ``cache_dir`` is where quantized variants are kept (the
    dispatcher points it into the state dir); None keeps them in memory only for this process.
    """

    name = "onnxruntime"
    options_class = OnnxRuntimeSection
    settings: OnnxRuntimeSection

    def __init__(self, settings: OnnxRuntimeSection | None = None,
                 cache_dir: Path | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise BackendUnavailable(f"onnxruntime is not installed ({exc}); "
                                     "pip install 'edgepilot[onnx]'") from None
        from edgepilot.backends.onnxrt_variants import VariantCache

        self._ort = ort
        self.settings = settings or OnnxRuntimeSection()
        self._variants = VariantCache(cache_dir, ort.__version__)
        self._models: dict[tuple[str, int, int], Any] = {}
        self._support: dict[tuple[str, str], Support] = {}
        self._lock = threading.Lock()
        # provider -> "" when it builds a session here, else why not (asked once each)
        self._loads: dict[str, str] = {}
        self._preload_gpu_libraries()

    @property
    def unloadable(self) -> dict[str, str]:
        """Providers onnxruntime lists that do not load here, with why (doctor shows them)."""
        with self._lock:
            return {p: why for p, why in self._loads.items() if why}

    def _preload_gpu_libraries(self) -> None:
        """Load CUDA/cuDNN from pip's nvidia-* wheels (onnxruntime-gpu[cuda,cudnn]) where the GPU
        providers are built in: without it the CUDA provider finds no libcudart on a machine
        whose CUDA is not in the system's library path, and silently runs nothing."""
        gpu = {"CUDAExecutionProvider", "TensorrtExecutionProvider"}
        preload = getattr(self._ort, "preload_dlls", None)
        if preload is None or not gpu & set(self._ort.get_available_providers()):
            return
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints what it misses
                preload()
        except Exception as exc:  # a library it cannot find is reported by _provider_loads
            log.debug("onnxruntime.preload_dlls: %s", exc)

    @property
    def cache_dir(self) -> Path | None:
        return self._variants.directory

    @cache_dir.setter
    def cache_dir(self, value: Path | None) -> None:
        self._variants.directory = value

    def version(self) -> str | None:
        return str(self._ort.__version__)

    # ---- probe ---------------------------------------------------------------------------------
    def devices(self) -> list[str]:
        """Short names of the providers available here (filtered by ``providers`` setting)."""
        available = self._ort.get_available_providers()
        wanted = self.settings.providers
        out = []
        for prov in available:
            dev = PROVIDER_DEVICES.get(prov)
            if dev is None:
                continue
            if wanted is not None and prov not in wanted and dev not in wanted:
                continue
            if dev not in CPU_DEVICES and not self._provider_loads(prov):
                continue
            out.append(dev)
        if "CPUExecutionProvider" in available and self._single_thread_differs() and (
                wanted is None or {SINGLE_THREAD, "cpu", "CPUExecutionProvider"} & set(wanted)):
            out.insert(out.index("cpu") + 1 if "cpu" in out else len(out), SINGLE_THREAD)
        return out

    def _provider_loads(self, provider: str) -> bool:
        """Whether ``provider`` builds a session here. onnxruntime-gpu lists CUDA and TensorRT
        wherever it is installed; one whose libraries are missing (no GPU, no libnvinfer) is
        skipped by onnxruntime with only a log line, and its "device" would measure the CPU."""
        with self._lock:
            known = self._loads.get(provider)
        if known is not None:
            return not known
        from edgepilot.backends.onnxrt_variants import identity_model

        why = ""
        try:
            self._session(identity_model(), PROVIDER_DEVICES[provider], strict=True)
        except Exception as exc:
            why = exc.message if isinstance(exc, BackendError) else f"{type(exc).__name__}: {exc}"
            log.warning("onnxruntime lists %s but it does not load here: %s", provider, why)
        with self._lock:
            self._loads[provider] = why
        return not why

    def _single_thread_differs(self) -> bool:
        """Whether ``cpu-1t`` is another way to run than ``cpu`` here: off by setting, on a
        one-core machine, or where ``intra_op_threads = 1`` already makes ``cpu`` one thread."""
        return (self.settings.single_thread and (os.cpu_count() or 1) > 1
                and self.settings.intra_op_threads != 1)

    def user_providers(self) -> list[str]:
        """The providers a user of this machine would hand ``InferenceSession`` for the whole
        file: CUDA first where it loads here (a GPU machine's user runs the GPU), then CPU."""
        available = self._ort.get_available_providers()
        gpu = [p for p in ("CUDAExecutionProvider",) if p in available
               and (self.settings.providers is None or p in self.settings.providers
                    or PROVIDER_DEVICES[p] in self.settings.providers)
               and self._provider_loads(p)]
        return [*gpu, "CPUExecutionProvider"]

    def probe(self) -> list[Target]:
        return [Target(self.name, dev, prec) for dev in self.devices()
                for prec in DEVICE_PRECISIONS.get(dev, {"fp32": "fp32"})]

    # ---- segments ------------------------------------------------------------------------------
    def _load(self, path: Path) -> Any:
        import onnx

        st = path.stat()
        key = (str(path), st.st_mtime_ns, st.st_size)
        with self._lock:
            model = self._models.get(key)
            if model is None:
                try:
                    model = onnx.load(str(path))
                except Exception as exc:
                    raise BackendError(f"{path} is not a loadable ONNX model: {exc}",
                                       field="model") from None
                self._models = {key: model}  # keep one: segments of one model come in runs
        return model

    def segment_model(self, segment: Segment) -> Any:
        """The fp32 ONNX graph of ``segment`` (the file itself for a whole-model segment)."""
        from edgepilot.backends.onnxrt_variants import extract

        model = self._load(Path(segment.model_path))
        if segment.is_whole:
            return model
        return extract(model, segment.inputs, segment.outputs)

    def _recipe(self, target: Target) -> str:
        if target.backend != self.name:
            raise BackendError(f"target {target} is not an onnxruntime target", field="target")
        precisions = DEVICE_PRECISIONS.get(target.device, {"fp32": "fp32"})
        if target.precision not in precisions:
            raise BackendError(
                f"precision {target.precision!r} is not offered on onnxruntime/{target.device}; "
                f"allowed: {', '.join(precisions)}", field="precision")
        return precisions[target.precision]

    def _session(self, data: bytes, device: str, strict: bool,
                 precision: str = "fp32") -> Any:
        ort = self._ort
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # always an explicit count: left at 0, onnxruntime pins each session's workers to
        # cores 1..n-1, every session to the same ones, and a caller the kernel placed on
        # core 1 then shares it with its own worker (a 2-core board: 19.5 ms where 15.0,
        # a 30% loss that came and went between windows); counted, none is pinned
        threads = 1 if device == SINGLE_THREAD else \
            self.settings.intra_op_threads or default_threads()
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 4  # its errors reach us as exceptions, not on stderr too
        if not self.settings.allow_spinning:
            # idle workers otherwise spin for work: with several sessions in one process (the
            # segments of a plan, other models) or another busy process, they take the core
            # the running session needs (2x slower on 2 cores with one of them busy)
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        provider = DEVICE_PROVIDERS[device]
        if strict and device not in CPU_DEVICES and device not in GPU_DEVICES:
            # no silent CPU fallback: a node the provider does not take fails the session.
            # GPU providers are exempt: CUDA places shape arithmetic (Shape, Gather on shapes)
            # on the CPU by design, so every dynamic Reshape would fail there
            opts.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        popts = self.settings.provider_options
        options = dict(popts.get(provider) or popts.get(device) or {})
        if provider == "CUDAExecutionProvider":  # an operator's own use_tf32 wins
            options.setdefault("use_tf32", "1" if precision == "tf32" else "0")
        session = _session_class(ort)(data, sess_options=opts, providers=[(provider, options)])
        if provider not in session.get_providers():
            raise BackendError(
                f"onnxruntime did not load {provider} here (it ran the session on "
                f"{', '.join(session.get_providers())}): its libraries are missing or do not "
                "match this onnxruntime build (for CUDA: pip install 'onnxruntime-gpu[cuda,cudnn]'"
                " and a driver for that CUDA)", field="target")
        return session

    def takes(self, kind: ModelKind) -> bool:
        return kind == "onnx"

    def supports(self, segment: Segment, target: Target) -> Support:
        if segment.kind != "onnx":
            return Support(False, f"onnxruntime runs ONNX models, not {segment.kind}")
        if target.backend != self.name or target.device not in self.devices():
            return Support(False, f"{target} is not available here")
        if target.precision not in DEVICE_PRECISIONS.get(target.device, {"fp32": "fp32"}):
            return Support(False, f"onnxruntime/{target.device} does not run "
                                  f"{target.precision}")
        if target.device in CPU_DEVICES:
            return Support(True)  # the CPU EP takes every standard op
        key = (_segment_key(segment), str(target))
        if key not in self._support:
            try:
                self.compile(segment, target)
                self._support[key] = Support(True)
            except BackendError as exc:
                self._support[key] = Support(False, exc.message)
        return self._support[key]

    def compile(self, segment: Segment, target: Target) -> Executable:
        if segment.kind != "onnx":
            raise BackendError(f"onnxruntime cannot compile a {segment.kind} segment",
                               field="segment")
        if target.device not in self.devices():
            raise BackendError(f"{target} is not available here; devices: "
                               f"{', '.join(self.devices())}", field="target")
        recipe = self._recipe(target)
        data = self._variants.get(self.segment_model(segment), recipe)
        try:
            session = self._session(data, target.device, strict=True,
                                    precision=target.precision)
        except Exception as exc:
            raise BackendError(f"onnxruntime refused {segment.name or 'segment'} on {target}: "
                               f"{exc}") from None
        return OrtExecutable(session, target, len(data), hashlib.sha256(data).hexdigest())


@functools.cache
def _session_class(ort: Any) -> type:
    """``InferenceSession`` without its Python-side fallback: on a provider error it prints to
    stdout (into ``plan --json``) and retries on CUDA/CPU, so a failing (segment, target) pair
    would be measured on another target under this one's name. The error must reach us."""
    return type("StrictInferenceSession", (ort.InferenceSession,), {
        "_enable_fallback": property(lambda self: False, lambda self, value: None)})


def _segment_key(segment: Segment) -> str:
    h = hashlib.sha1(str(segment.model_path).encode())
    h.update(repr((segment.inputs, segment.outputs, segment.layers)).encode())
    return h.hexdigest()
