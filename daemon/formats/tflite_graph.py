"""TFLite flatbuffers as graphs: layers, segment boundaries and cutting a segment out.

A TFLite model's layers are the operators of its main subgraph, in file order (which is a
topological order). :func:`cut` writes a new, self-contained ``.tflite`` holding only the
operators between named boundary tensors: the tensors named at the cut become the new model's
inputs and outputs, so the TFLite and Arm NN backends can run a sub-range like ONNX Runtime does.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flatbuffers
import numpy as np

from edgepilot.errors import BackendError, UnrunnableModel
from edgepilot.formats.sniff import misnamed
from edgepilot.formats.spec import Segment

_cache_lock = threading.Lock()
_cache: dict[tuple[str, int, int], Any] = {}


def schema() -> Any:
    try:
        from ai_edge_litert import schema_py_generated
    except ImportError:  # tflite_runtime ships no schema; the one in tensorflow is the same
        from tensorflow.lite.python import schema_py_generated
    return schema_py_generated


def load(path: Path) -> Any:
    """Parse ``path`` into the schema's object API (``ModelT``), cached by mtime and size."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    data = path.read_bytes()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise UnrunnableModel(f"{path.name} is not a TFLite flatbuffer (no TFL3 identifier)"
                              f"{misnamed(path, 'tflite')}", field="file")
    try:
        model = schema().ModelT.InitFromPackedBuf(data, 0)
    except Exception as exc:  # flatbuffers raises struct.error, IndexError... on a cut file
        raise UnrunnableModel(f"{path.name} is not a readable TFLite model (truncated or "
                              f"damaged: {type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:160]})", field="file") from None
    with _cache_lock:
        _cache.clear()  # one model at a time is enough; these are re-read rarely
        _cache[key] = model
    return model


def signature_keys(path: Path) -> tuple[str | None, tuple[str, ...]]:
    """The signature the interpreter runs by default (the one on subgraph 0; None when the
    file names none there) and every signature key, in file order."""
    defs = load(path).signatureDefs or []
    keys = tuple(d.signatureKey.decode() for d in defs)
    main = next((d.signatureKey.decode() for d in defs if d.subgraphIndex == 0), None)
    return main, keys


def pack(model: Any) -> bytes:
    """Serialise a ``ModelT`` back to ``.tflite`` bytes."""
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _name(tensor: Any) -> str:
    raw = tensor.name
    return raw.decode() if isinstance(raw, bytes) else str(raw or "")


def _is_const(model: Any, tensor: Any) -> bool:
    buf = model.buffers[tensor.buffer] if tensor.buffer < len(model.buffers) else None
    has_data = buf is not None and buf.data is not None and len(buf.data) > 0
    # a tensor of no elements has nothing to store, so its buffer is empty: still a constant
    # (onnx-tf writes a squeeze to a scalar as RESHAPE with a shape tensor of shape [0])
    empty = tensor.shape is not None and 0 in _ints(tensor.shape)
    return buf is not None and (has_data or (buf.size or 0) > 0 or empty)


def _ints(values: Any) -> list[int]:
    return [int(v) for v in (values if values is not None else [])]


@dataclass(frozen=True)
class Layer:
    """One operator of the main subgraph."""

    index: int
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _op_names(model: Any) -> list[tuple[str, bool]]:
    """(name, is custom) of each operator code of ``model`` (object API): a builtin by its
    schema name, a custom op by its own (what an error about it must say)."""
    names = {v: k for k, v in vars(schema().BuiltinOperator).items() if not k.startswith("_")}
    out = []
    for code in model.operatorCodes or []:
        opname = names.get(max(code.builtinCode, code.deprecatedBuiltinCode), "CUSTOM")
        custom = opname == "CUSTOM"
        if custom and code.customCode:
            raw = code.customCode
            opname = raw.decode() if isinstance(raw, bytes) else str(raw)
        out.append((opname, custom))
    return out


def layers(path: Path) -> list[Layer]:
    """The main subgraph's operators in execution order."""
    model = load(path)
    sg = model.subgraphs[0]
    op_names = _op_names(model)
    out = []
    for i, op in enumerate(sg.operators or []):
        opname = op_names[op.opcodeIndex][0]
        ins = tuple(_name(sg.tensors[t]) for t in _ints(op.inputs) if t >= 0
                    and not _is_const(model, sg.tensors[t]))
        outs = tuple(_name(sg.tensors[t]) for t in _ints(op.outputs))
        out.append(Layer(i, opname, ins, outs))
    return out


def io_names(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The main subgraph's input and output tensor names."""
    sg = load(path).subgraphs[0]
    return (tuple(_name(sg.tensors[i]) for i in _ints(sg.inputs)),
            tuple(_name(sg.tensors[i]) for i in _ints(sg.outputs)))


def segment(path: Path, start: int, end: int, name: str = "") -> Segment:
    """The segment of operators ``[start, end)``, its boundary tensors named.

    Inputs: non-constant tensors read in the range and not written there. Outputs: tensors
    written in the range and read after it, or that are model outputs.
    """
    model = load(path)
    sg = model.subgraphs[0]
    n_ops = len(sg.operators or [])
    if not 0 <= start < end <= n_ops:
        raise BackendError(f"segment [{start}, {end}) outside the model's 0..{n_ops} operators",
                           field="segment.layers")
    produced_in: set[int] = set()
    inputs: list[int] = []
    for op in sg.operators[start:end]:
        for t in _ints(op.inputs):
            if t < 0 or t in produced_in or t in inputs:
                continue
            tensor = sg.tensors[t]
            if not _is_const(model, tensor) and not tensor.isVariable:
                inputs.append(t)
        produced_in.update(_ints(op.outputs))
    read_after = {t for op in sg.operators[end:] for t in _ints(op.inputs)}
    model_outs = set(_ints(sg.outputs))
    outputs = [t for op in sg.operators[start:end] for t in _ints(op.outputs)
               if t in read_after or t in model_outs]
    return Segment(path, "tflite", tuple(_name(sg.tensors[t]) for t in inputs),
                   tuple(_name(sg.tensors[t]) for t in outputs), (start, end),
                   name or f"{path.stem}[{start}:{end}]")


# cut segments by (file version, boundary), least recently used dropped past this many bytes:
# planning cuts each layer several times (support check, compile, retime) and one cut of a
# MediaPipe model costs ~0.2 s of flatbuffer packing in Python
_CUTS_MAX_BYTES = 64 << 20
_cuts: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()


def cut(path: Path, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> bytes:
    """A new model computing ``outputs`` from ``inputs`` with only the operators needed."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size, tuple(inputs), tuple(outputs))
    with _cache_lock:
        hit = _cuts.get(key)
        if hit is not None:
            _cuts.move_to_end(key)
            return hit
    data = _cut(path, inputs, outputs)
    with _cache_lock:
        _cuts[key] = data
        while len(_cuts) > 1 and sum(len(v) for v in _cuts.values()) > _CUTS_MAX_BYTES:
            _cuts.popitem(last=False)
    return data


def _cut(path: Path, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> bytes:
    model = _private(load(path))
    sg = model.subgraphs[0]
    index = {_name(t): i for i, t in enumerate(sg.tensors)}
    for role, names in (("inputs", inputs), ("outputs", outputs)):
        missing = [n for n in names if n not in index]
        if missing:
            raise BackendError(f"segment {role} {missing} are not tensors of {path.name}",
                               field=f"segment.{role}")
    if any((b.offset or 0) > 1 for b in model.buffers or []):
        raise BackendError(f"{path.name} keeps weights outside the flatbuffer (>2 GB layout); "
                           "it can only run whole", field="segment")
    in_idx = [index[n] for n in inputs]
    out_idx = [index[n] for n in outputs]
    producer = {t: i for i, op in enumerate(sg.operators or []) for t in _ints(op.outputs)}
    keep: set[int] = set()
    stack = list(out_idx)
    seen: set[int] = set()
    while stack:
        t = stack.pop()
        if t in seen or t in in_idx:
            continue
        seen.add(t)
        if t in producer:
            op_i = producer[t]
            if op_i not in keep:
                keep.add(op_i)
                stack.extend(x for x in _ints(sg.operators[op_i].inputs) if x >= 0)
        elif not _is_const(model, sg.tensors[t]) and not sg.tensors[t].isVariable:
            raise BackendError(
                f"segment outputs need tensor {_name(sg.tensors[t])!r}, which is neither a "
                "segment input nor a constant; add it to the segment inputs",
                field="segment.inputs")
    ops = [copy.copy(op) for i, op in enumerate(sg.operators or []) if i in keep]
    used: list[int] = []
    for t in [*in_idx, *out_idx] + [x for op in ops for x in (
            _ints(op.inputs) + _ints(op.outputs) + _ints(op.intermediates))]:
        if t >= 0 and t not in used:
            used.append(t)
    remap = {old: new for new, old in enumerate(used)}
    for op in ops:
        op.inputs = [remap[t] if t >= 0 else -1 for t in _ints(op.inputs)]
        op.outputs = [remap[t] for t in _ints(op.outputs)]
        if op.intermediates is not None:
            op.intermediates = [remap[t] for t in _ints(op.intermediates)]
    sg.tensors = [sg.tensors[t] for t in used]
    sg.operators = ops
    sg.inputs = [remap[t] for t in in_idx]
    sg.outputs = [remap[t] for t in out_idx]
    model.signatureDefs = []  # they index the old tensor list
    _prune_buffers(model)
    return pack(model)


def _private(base: Any) -> Any:
    """A copy of the cached model that a cut may change: every object it reassigns a field of
    (model, subgraphs, tensors, metadata) copied shallowly, buffers shared (packing and parsing
    the whole model again to copy it cost ~1 s per cut of a 5 MB file)."""
    model = copy.copy(base)
    model.subgraphs = []
    for sg in base.subgraphs:
        c = copy.copy(sg)
        c.tensors = [copy.copy(t) for t in sg.tensors or []]
        model.subgraphs.append(c)
    if base.metadata is not None:
        model.metadata = [copy.copy(m) for m in base.metadata]
    return model


def _prune_buffers(model: Any) -> None:
    """Drop buffers no tensor or metadata refers to any more (buffer 0 stays: the empty one)."""
    refs = {0}
    for sg in model.subgraphs:
        refs.update(t.buffer for t in sg.tensors or [])
    refs.update(m.buffer for m in model.metadata or [])
    refs.update(_ints(model.metadataBuffer))
    order = sorted(refs)
    remap = {old: new for new, old in enumerate(order)}
    model.buffers = [model.buffers[i] for i in order]
    for sg in model.subgraphs:
        for t in sg.tensors or []:
            t.buffer = remap[t.buffer]
    for m in model.metadata or []:
        m.buffer = remap[m.buffer]
    if model.metadataBuffer is not None:
        model.metadataBuffer = np.array([remap[int(i)] for i in model.metadataBuffer],
                                        dtype=np.int32)


def custom_ops(data: bytes) -> set[str]:
    """The custom operators a TFLite flatbuffer runs (every subgraph), by their own names."""
    return {name for name, custom in _operators(data) if custom}


def has_resource_variables(data: bytes) -> bool:
    """Whether a TFLite flatbuffer keeps state in resource variables (``VAR_HANDLE``, set up
    by a ``CALL_ONCE`` init subgraph): LiteRT's ``reset_all_variables`` leaves those as
    they are."""
    return ("VAR_HANDLE", False) in _operators(data)


def _unpacked(data: bytes) -> Any:
    """A flatbuffer in bytes (a cut, not a file) as the schema's object API."""
    try:
        return schema().ModelT.InitFromPackedBuf(data, 0)
    except Exception as exc:  # flatbuffers raises struct.error, IndexError... on a cut file
        raise UnrunnableModel(f"not a readable TFLite model ({type(exc).__name__}: {exc})",
                              field="file") from None


def _operators(data: bytes) -> set[tuple[str, bool]]:
    """(name, is custom) of every operator a TFLite flatbuffer runs (every subgraph)."""
    model = _unpacked(data)
    op_names = _op_names(model)
    return {op_names[op.opcodeIndex] for sg in model.subgraphs or []
            for op in sg.operators or []}


def computed_parameters(data: bytes, wanted: Mapping[str, tuple[int, ...]]) -> list[str]:
    """``"OP input K"`` for each operator named in ``wanted`` (every subgraph) whose input K
    (one of those listed for it) is computed at run time, not a constant in the file: a
    segment cut between its parameter's producer and it, or a graph that derives a block
    shape from its input's SHAPE."""
    model = _unpacked(data)
    op_names = _op_names(model)
    buffers = model.buffers or []
    found: list[str] = []
    for sg in model.subgraphs or []:
        for op in sg.operators or []:
            name = op_names[op.opcodeIndex][0]
            ins = _ints(op.inputs)
            for k in wanted.get(name, ()):
                if k >= len(ins) or ins[k] < 0:
                    continue
                buf = sg.tensors[ins[k]].buffer
                data_k = buffers[buf].data if 0 <= buf < len(buffers) else None
                if data_k is None or len(data_k) == 0:
                    found.append(f"{name} input {k}")
    return sorted(set(found))


def has_variable_tensors(path: Path) -> bool:
    """Whether the main subgraph keeps variable tensors: state an operator (a stateful LSTM)
    writes on one invoke and reads on the next."""
    return any(t.isVariable for t in load(path).subgraphs[0].tensors)


def is_quantized(path: Path) -> bool:
    """True when the main subgraph's model inputs are int8/uint8 (a fully quantized model)."""
    model = load(path)
    sg = model.subgraphs[0]
    tt = schema().TensorType
    return any(sg.tensors[i].type in (tt.INT8, tt.UINT8) for i in _ints(sg.inputs))
