"""ONNX graphs as partitioner nodes: per-node FLOPs, weight bytes and tensor sizes.

Shapes come from ONNX shape inference; symbolic dimensions count as 1 (the planner profiles the
shapes it is given). FLOPs count a multiply-add as two.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from edgepilot.dispatch.partition import Node
from edgepilot.errors import PlanError

# rough per-element costs for non-GEMM ops, so their layers are not "free" to the coalescer
_ELEMENTWISE_COST = {"Softmax": 5, "LayerNormalization": 8, "Gelu": 8, "Erf": 8, "Exp": 4,
                     "Sigmoid": 4, "Tanh": 4, "MaxPool": 4, "AveragePool": 4}


def _shape(vi: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
            for d in vi.type.tensor_type.shape.dim]


def read_onnx(path: Path) -> tuple[list[Node], list[str], list[str], dict[str, int]]:
    """Nodes in file order, graph inputs, graph outputs and bytes per tensor name."""
    try:
        model = onnx.load(str(path))
        model = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:
        raise PlanError(f"{path.name} is not a readable ONNX model: {exc}", field="model") from None
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    consts = set(inits)
    shapes: dict[str, list[int]] = {}
    sizes: dict[str, int] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        shapes[vi.name] = _shape(vi)
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type) \
            if vi.type.tensor_type.elem_type else np.dtype(np.float32)
        sizes[vi.name] = math.prod(shapes[vi.name]) * np.dtype(dtype).itemsize
    for name, init in inits.items():
        shapes[name] = list(init.dims)
    nodes: list[Node] = []
    for k, n in enumerate(g.node):
        if n.op_type == "Constant":
            consts.update(n.output)
            continue
        wbytes = sum(_init_bytes(inits[t]) for t in n.input if t in inits)
        nodes.append(Node(
            name=n.name or f"{n.op_type}_{k}", op=n.op_type,
            inputs=tuple(t for t in n.input if t and t not in consts),
            outputs=tuple(t for t in n.output if t),
            flops=_flops(n, shapes), weight_bytes=wbytes))
    ins = [vi.name for vi in g.input if vi.name not in inits]
    outs = [vi.name for vi in g.output]
    return nodes, ins, outs, sizes


def _init_bytes(t: onnx.TensorProto) -> int:
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    return math.prod(t.dims) * itemsize


def _flops(n: onnx.NodeProto, shapes: dict[str, list[int]]) -> int:
    out = shapes.get(n.output[0]) if n.output else None
    out_elems = math.prod(out) if out else 0
    if n.op_type in ("MatMul", "Gemm", "MatMulInteger", "FusedMatMul"):
        a = shapes.get(n.input[0])
        if not a or out is None:
            return out_elems
        k = a[-1]
        if n.op_type == "Gemm":
            trans_a = next((at.i for at in n.attribute if at.name == "transA"), 0)
            k = a[0] if trans_a else a[-1]
        return 2 * out_elems * k
    if n.op_type in ("Conv", "ConvTranspose"):
        w = shapes.get(n.input[1])
        if not w or out is None:
            return out_elems
        group = next((at.i for at in n.attribute if at.name == "group"), 1)
        per_out = math.prod(w[1:]) if n.op_type == "Conv" else w[0] // max(group, 1) \
            * math.prod(w[2:])
        return 2 * out_elems * per_out
    return out_elems * _ELEMENTWISE_COST.get(n.op_type, 1)
