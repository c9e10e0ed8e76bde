"""TFLite through ai_edge_litert (fallback tflite_runtime): XNNPACK, plain CPU, external delegates.

Devices: ``xnnpack`` (the runtime's default delegate), ``cpu`` (builtin kernels, no default
delegate) and one device per ``[backends.tflite] delegates`` entry (name -> .so, e.g. the Arm NN
delegate or a vendor NPU delegate). Precision is the file's own: ``int8`` for a model with
quantized inputs, else ``fp32``. A segment is cut out of the flatbuffer
(:mod:`edgepilot.formats.tflite_graph`), so any operator range can run on its own.

No silent fallback off a device: a delegate takes the operators it can and leaves the rest to
the builtin CPU kernels without a word. So an external delegate target (an NPU or GPU) supports
a segment only when, with the delegate applied, no operator of the segment is left outside it
(:func:`ops_outside_delegates` reads the interpreter's node list); the planner gives it the
layers it takes whole. ``xnnpack`` is a CPU delegate: the operators it leaves run on the builtin
kernels of the same interpreter, on the same device, so it supports any segment (the split is
reported in :class:`Support`'s reason); ``cpu`` runs anything.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgepilot.backends import tflite_preflight as preflight
from edgepilot.backends.base import (
    Backend,
    BackendUnavailable,
    Executable,
    ModelKind,
    Segment,
    Support,
    Target,
)
from edgepilot.backends.native_log import stderr_without
from edgepilot.backends.tflite_executable import TfliteExecutable, one_line
from edgepilot.backends.tflite_options import TfliteSection
from edgepilot.errors import BackendError
from edgepilot.formats import tflite_graph

log = logging.getLogger(__name__)

BUILTIN_DEVICES = ("xnnpack", "cpu")
# printed to fd 2 by the runtime when its first XNNPACK delegate is made (once per process)
XNNPACK_LINE = b"Created TensorFlow Lite XNNPACK delegate for CPU."
_xnnpack_started = False


@contextlib.contextmanager
def first_xnnpack() -> Iterator[None]:
    """Around code that may make the process's first XNNPACK delegate (an interpreter with
    the default delegates, allocated): the runtime's INFO line about it is dropped."""
    global _xnnpack_started
    if _xnnpack_started:
        yield
        return
    with stderr_without([XNNPACK_LINE]):
        yield
    _xnnpack_started = True


def _interpreter_module() -> Any:
    try:
        from ai_edge_litert import interpreter
    except ImportError:
        try:
            from tflite_runtime import interpreter
        except ImportError:
            raise BackendUnavailable(
                "neither ai_edge_litert nor tflite_runtime is installed; "
                "pip install 'edgepilot[tflite]'") from None
    return interpreter


def _dynamic_inputs(interp: Any) -> bool:
    """Whether any input of ``interp`` has a dim the file leaves open (-1)."""
    return any(-1 in list(d.get("shape_signature", [])) for d in interp.get_input_details())


def file_precision(path: Path) -> str:
    return "int8" if tflite_graph.is_quantized(path) else "fp32"


def ops_outside_delegates(interp: Any, n_ops: int) -> list[str]:
    """Operators of an allocated interpreter that run on builtin kernels, not in a delegate.

    Nodes ``0..n_ops-1`` are the model's operators; applying a delegate appends one node per
    partition it took (named ``DELEGATE``), whose inputs/outputs are the partition's boundary
    tensors. The execution plan is not exposed to Python, so walk back from the graph outputs:
    a tensor made by a delegate node needs that node's inputs; a tensor made by an original
    operator (and by no delegate) means that operator runs outside every delegate.
    """
    nodes = interp._get_ops_details()  # LiteRT's node list, delegate nodes included
    made_by_op = {int(t): i for i in range(n_ops) for t in nodes[i]["outputs"]}
    made_by_delegate = {int(t): j for j in range(n_ops, len(nodes)) for t in nodes[j]["outputs"]}
    outside: set[int] = set()
    seen: set[int] = set()
    todo = [int(d["index"]) for d in interp.get_output_details()]
    while todo:
        t = todo.pop()
        if t in seen or t < 0:
            continue
        seen.add(t)
        node = made_by_delegate.get(t)
        if node is None:
            node = made_by_op.get(t)
            if node is None:
                continue  # a model input or a constant
            outside.add(node)
        todo.extend(int(x) for x in nodes[node]["inputs"])
    return [f"{nodes[i]['op_name']}#{i}" for i in sorted(outside)]


def tensor_shapes(path: Path, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape when ``path`` runs on inputs of ``shapes`` (the interpreter's own
    shape propagation, builtin kernels, nothing delegated)."""
    preflight.check(path)
    mod = _interpreter_module()
    try:
        interp = mod.Interpreter(model_path=str(path), experimental_op_resolver_type=(
            mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
        for d in interp.get_input_details():
            if d["name"] in shapes:
                interp.resize_tensor_input(d["index"], list(shapes[d["name"]]), strict=False)
        interp.allocate_tensors()
        return {d["name"]: tuple(int(x) for x in d["shape"])
                for d in interp.get_tensor_details()}
    except (ValueError, RuntimeError) as exc:
        raise BackendError(f"TFLite cannot run {path.name} on input shapes "
                           f"{dict(shapes)}: {exc}", field="input_shape") from None


def _n_ops(content: bytes) -> int:
    return int(tflite_graph.schema().Model.GetRootAs(content, 0).Subgraphs(0).OperatorsLength())


class TfliteBackend(Backend):
    """TFLite interpreter targets; external delegates are loaded by path from config."""

    name = "tflite"
    options_class = TfliteSection
    settings: TfliteSection

    def __init__(self, settings: TfliteSection | None = None) -> None:
        self.settings = settings or TfliteSection()
        self._lock = threading.Lock()
        # (file, mtime, size, segment io, device, .so) -> whether the delegate takes it all
        self._delegated: dict[tuple[Any, ...], Support] = {}

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

    def takes(self, kind: ModelKind) -> bool:
        return kind == "tflite"

    def supports(self, segment: Segment, target: Target) -> Support:
        if segment.kind != "tflite":
            return Support(False, f"the TFLite backend runs .tflite files, not {segment.kind}")
        preflight.check(segment.model_path)  # a file the interpreter crashes on never loads here
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
        if target.device == "cpu":
            return Support(True)  # builtin kernels are the fallback; nothing can fall further
        return self._delegation(segment, target.device)

    def _delegation(self, segment: Segment, device: str) -> Support:
        """Whether ``device``'s delegate takes every operator of ``segment`` (cached)."""
        st = segment.model_path.stat()
        key = (str(segment.model_path), st.st_mtime_ns, st.st_size, segment.inputs,
               segment.outputs, device, str(self.settings.delegates.get(device, "")))
        with self._lock:
            if key in self._delegated:
                return self._delegated[key]
        try:
            content = self.model_bytes(segment)
            interp, allocated = self._interpreter(content, device, segment.model_path.name)
            outside = ops_outside_delegates(interp, _n_ops(content)) if allocated else []
        except BackendError as exc:
            support = Support(False, exc.message)
        else:
            if not allocated and device != "xnnpack":
                # what a delegate takes is known once the graph is prepared, here only at the
                # first call's shapes: not checked, so not offered (no silent CPU fallback)
                outside = ["(dynamic inputs: delegation checked only at run time)"]
            support = Support(True)
            if outside:
                shown = ", ".join(outside[:8]) + (" ..." if len(outside) > 8 else "")
                if device == "xnnpack":
                    # XNNPACK is itself a CPU delegate: what it leaves runs on the builtin
                    # kernels of the same interpreter, on the same device, with no hop
                    support = Support(True, (
                        f"XNNPACK takes {_n_ops(content) - len(outside)} of {_n_ops(content)} "
                        f"operators; {shown} run on the builtin kernels in the same "
                        "interpreter"))
                else:
                    support = Support(False, (
                        f"the {device} delegate leaves {len(outside)} of {_n_ops(content)} "
                        f"operators on the builtin CPU kernels ({shown}); that would be a "
                        "silent fallback off the device, so the planner runs only the "
                        "layers it takes there"))
        with self._lock:
            self._delegated[key] = support
        return support

    def model_bytes(self, segment: Segment) -> bytes:
        """The flatbuffer to load: the file itself, or the segment cut out of it."""
        if segment.is_whole:
            return segment.model_path.read_bytes()
        return tflite_graph.cut(segment.model_path, segment.inputs, segment.outputs)

    def compile(self, segment: Segment, target: Target) -> Executable:
        support = self.supports(segment, target)
        if not support:
            raise BackendError(f"{target} cannot run {segment.model_path.name}: {support.reason}")
        content = self.model_bytes(segment)
        label = segment.model_path.name
        interp, allocated = self._interpreter(content, target.device, label)
        rebuild = (lambda: self._interpreter(content, target.device, label)) \
            if tflite_graph.has_resource_variables(content) else None
        return TfliteExecutable(interp, target, len(content), allocated, rebuild)

    def _interpreter(self, content: bytes, device: str, label: str) -> tuple[Any, bool]:
        """An interpreter for ``content`` on ``device`` (delegates applied) and whether it is
        allocated (a model with dynamic inputs that does not prepare at its placeholder shapes
        is allocated at its first call's)."""
        mod = _interpreter_module()
        kwargs: dict[str, Any] = {"model_content": content}
        if self.settings.threads:
            kwargs["num_threads"] = self.settings.threads
        if device == "cpu":
            kwargs["experimental_op_resolver_type"] = (
                mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        elif device != "xnnpack":
            so = self.settings.delegates[device]
            try:
                kwargs["experimental_delegates"] = [mod.load_delegate(str(so))]
            except (ValueError, OSError) as exc:
                raise BackendError(f"could not load TFLite delegate {so}: {exc}",
                                   field=f"backends.tflite.delegates.{device}") from None
            # without XNNPACK behind it, what the delegate leaves is visible (and refused)
            kwargs["experimental_op_resolver_type"] = (
                mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        interp = None
        try:
            with first_xnnpack() if device == "xnnpack" else contextlib.nullcontext():
                interp = mod.Interpreter(**kwargs)
                interp.allocate_tensors()  # applies the default (XNNPACK) delegate
        except (ValueError, RuntimeError) as exc:
            if interp is not None and _dynamic_inputs(interp):
                # at the file's placeholder shapes (1 for each -1 dim) a dynamic model may not
                # prepare (openWakeWord's mel front end: a conv over 1 sample); it is allocated
                # at its first call's shapes, as a user of the raw interpreter resizes first
                return interp, False
            raise BackendError(f"TFLite could not build {label} on {self.name}/{device}: "
                               f"{one_line(exc)}") from None
        return interp, True
