"""A tensor model's declared inputs/outputs, read from the file without loading a runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgepilot.errors import ModelError, UnrunnableModel
from edgepilot.formats import tflite_graph
from edgepilot.formats.file_cache import per_file
from edgepilot.formats.sniff import misnamed
from edgepilot.formats.spec import TensorSpec

# STRING as ONNX strings are: numpy object arrays (of str or bytes)
_TFLITE_DTYPES = {"FLOAT32": "float32", "FLOAT16": "float16", "INT32": "int32", "UINT8": "uint8",
                  "INT64": "int64", "INT16": "int16", "INT8": "int8", "BOOL": "bool",
                  "FLOAT64": "float64", "STRING": "object", "COMPLEX64": "complex64",
                  "COMPLEX128": "complex128", "UINT16": "uint16", "UINT32": "uint32",
                  "UINT64": "uint64"}


def tensor_specs(path: Path, kind: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(inputs, outputs) of ``path``: names, numpy dtype names, shapes (None = dynamic).

    Every tensor request validates against these, so they are kept per (file, mtime, size):
    parsing a 25 MB ONNX file took 2.8 ms, several times the inference it guarded.
    """
    ins, outs = _specs(path, kind)
    return list(ins), list(outs)


@per_file()
def _specs(path: Path, kind: str) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    ins, outs = _read_specs(path, kind)
    return tuple(ins), tuple(outs)


def _read_specs(path: Path, kind: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    if kind == "onnx":
        return _onnx_specs(path)
    if kind == "tflite":
        return _tflite_specs(path)
    if kind == "gguf":
        return [TensorSpec("tokens", "int32", (None,))], [TensorSpec("logits", "float32",
                                                                      (None,))]
    raise ModelError(f"unknown model kind {kind!r}; allowed: gguf, onnx, tflite", field="kind")


def _onnx_specs(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    import onnx
    from onnx import helper

    from edgepilot.formats.onnx_outline import onnx_outline

    try:
        model = onnx_outline(path)
    except Exception as exc:  # onnx raises DecodeError and friends
        raise UnrunnableModel(f"{path.name} is not a readable ONNX model: {exc}"
                              f"{misnamed(path, 'onnx')}", field="file") from None
    if not model.graph.output:  # an empty file parses as an empty model: nothing to run
        raise UnrunnableModel(f"{path.name} is not a readable ONNX model: it holds no graph "
                              f"outputs ({path.stat().st_size} bytes)", field="file")
    inits = {i.name for i in model.graph.initializer}
    outputs = list(model.graph.output)
    if any(not o.type.WhichOneof("value") for o in outputs):
        # a graph output may be declared by name alone (legal ONNX; onnxscript-style builders
        # write it): onnx's shape inference finds its type, as onnxruntime does when it runs
        outputs = _inferred_outputs(model)

    def spec(vi: onnx.ValueInfoProto, role: str) -> TensorSpec:
        tt = vi.type.tensor_type
        try:
            if vi.type.WhichOneof("value") != "tensor_type":
                raise KeyError(vi.type.WhichOneof("value"))
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name
        except (KeyError, TypeError, ValueError):
            raise UnrunnableModel(f"{path.name}: {role} {vi.name!r} is {_kind_of(vi.type)}; "
                                  "edgepilot serves models whose inputs and outputs are tensors"
                                  f"{_ZIPMAP if _is_zipmap(vi.type) else ''}",
                                  field="file") from None
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                      for d in tt.shape.dim)
        # no shape field at all is an unknown rank, not a scalar (a scalar has an empty one)
        return TensorSpec(vi.name, dtype, shape, rank_known=tt.HasField("shape"))

    return ([spec(v, "input") for v in model.graph.input if v.name not in inits],
            [spec(v, "output") for v in outputs])


def _inferred_outputs(model: Any) -> list[Any]:
    """The graph's outputs with the types onnx's shape inference gives those declared without
    one (kept as declared where it finds none)."""
    from onnx import shape_inference

    try:
        inferred = shape_inference.infer_shapes(model).graph.output
    except Exception:  # inference refuses some graphs; the untyped output then says so
        return list(model.graph.output)
    typed = {o.name: o for o in inferred if o.type.WhichOneof("value")}
    return [typed.get(o.name, o) for o in model.graph.output]


_ZIPMAP = (" (skl2onnx writes a classifier's probabilities as a sequence of maps, ZipMap: "
           "convert it with options={'zipmap': False} to get them as a tensor)")


def _kind_of(t: Any) -> str:
    """An ONNX type in words: 'a sequence of maps', 'a tensor of bfloat16', ..."""
    import onnx

    which = t.WhichOneof("value")
    if which == "tensor_type":
        return f"a tensor of {onnx.TensorProto.DataType.Name(t.tensor_type.elem_type).lower()}"
    if which == "sequence_type":
        return "a sequence of " + _kind_of(t.sequence_type.elem_type).removeprefix("a ") + "s"
    if which == "map_type":
        return "a map"
    if which == "optional_type":
        return "an optional " + _kind_of(t.optional_type.elem_type).removeprefix("a ")
    if not which:
        return "declared without a type (and onnx's shape inference finds none)"
    return f"a {str(which).replace('_type', '').replace('_', ' ')}"


def _is_zipmap(t: Any) -> bool:
    return bool(t.WhichOneof("value") == "sequence_type"
                and t.sequence_type.elem_type.WhichOneof("value") == "map_type")


def _tflite_specs(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    model = tflite_graph.load(path)
    sg = model.subgraphs[0]
    names = {v: k for k, v in vars(tflite_graph.schema().TensorType).items()
             if not k.startswith("_")}

    def spec(i: int) -> TensorSpec:
        t = sg.tensors[i]
        sig = t.shapeSignature if t.shapeSignature is not None and len(t.shapeSignature) else None
        dims = sig if sig is not None else (t.shape if t.shape is not None else [])
        name = t.name.decode() if isinstance(t.name, bytes) else str(t.name)
        return TensorSpec(name, _TFLITE_DTYPES.get(names.get(t.type, ""), "unknown"),
                          tuple(int(d) if int(d) >= 0 else None for d in dims))

    return ([spec(int(i)) for i in sg.inputs], [spec(int(i)) for i in sg.outputs])
