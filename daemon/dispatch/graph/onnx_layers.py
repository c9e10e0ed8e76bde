"""ONNX graphs as partitioner nodes: per-node FLOPs, weight bytes and tensor sizes.

Planning reads a graph made concrete for the plan's input shapes
(:mod:`edgepilot.dispatch.graph.onnx_shapes`), so every tensor has its real size. A node holding
subgraphs (``If``, ``Loop``, ``Scan``) is one node whose inputs include the outer-scope tensors
its subgraphs read, so no cut ever separates them. FLOPs count a multiply-add as two.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from edgepilot.dispatch.graph.onnx_shapes import TensorInfo
from edgepilot.errors import PlanError
from edgepilot.formats.graph_node import Node
from edgepilot.formats.onnx_graph import implicit_inputs, subgraphs

# rough per-element costs for non-GEMM ops, so their layers are not "free" to the coalescer
_ELEMENTWISE_COST = {"Softmax": 5, "LayerNormalization": 8, "Gelu": 8, "Erf": 8, "Exp": 4,
                     "Sigmoid": 4, "Tanh": 4, "MaxPool": 4, "AveragePool": 4}
_GEMM = ("MatMul", "Gemm", "MatMulInteger", "FusedMatMul", "QLinearMatMul", "MatMulNBits")
_CONV = ("Conv", "ConvTranspose", "ConvInteger", "QLinearConv")
# weight input position of the quantized ops (QLinearConv/QLinearMatMul carry scales first)
_WEIGHT_INPUT = {"QLinearConv": 3, "QLinearMatMul": 3}


def _shape(vi: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
            for d in vi.type.tensor_type.shape.dim]


def read_onnx(path: Path) -> tuple[list[Node], list[str], list[str], dict[str, int]]:
    """Nodes of a file with static shapes (symbolic dims count as 1): the kernel corpus's
    one-operator models. Real models go through :func:`nodes_of` on a concrete graph."""
    try:
        model = onnx.load(str(path))
        model = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:
        raise PlanError(f"{path.name} is not a readable ONNX model: {exc}", field="model") from None
    tensors: dict[str, TensorInfo] = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        elem = vi.type.tensor_type.elem_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name if elem else "float32"
        tensors[vi.name] = TensorInfo(dtype, tuple(_shape(vi)))
    for init in model.graph.initializer:
        tensors[init.name] = TensorInfo(
            np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).name, tuple(init.dims))
    return nodes_of(model, tensors)


def nodes_of(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo]
             ) -> tuple[list[Node], list[str], list[str], dict[str, int]]:
    """Nodes in file order, graph inputs, graph outputs and bytes per tensor name."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    consts = set(inits)
    shapes = {name: list(info.shape) for name, info in tensors.items()}
    sizes = {name: info.nbytes for name, info in tensors.items() if name not in inits}
    nodes: list[Node] = []
    for k, n in enumerate(g.node):
        if n.op_type == "Constant":
            consts.update(n.output)
            continue
        reads = [*n.input, *implicit_inputs(n)]
        wbytes = sum(_init_bytes(inits[t]) for t in reads if t in inits)
        wbytes += sum(_init_bytes(i) for sg in subgraphs(n) for i in sg.initializer)
        nodes.append(Node(
            name=n.name or f"{n.op_type}_{k}", op=n.op_type,
            inputs=tuple(dict.fromkeys(t for t in reads if t and t not in consts)),
            outputs=tuple(t for t in n.output if t),
            flops=_flops(n, shapes), weight_bytes=wbytes))
    ins = [vi.name for vi in g.input if vi.name not in inits]
    outs = [vi.name for vi in g.output]
    return nodes, ins, outs, sizes


def _init_bytes(t: onnx.TensorProto) -> int:
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    return math.prod(t.dims) * itemsize


def _flops(n: onnx.NodeProto, shapes: Mapping[str, list[int]]) -> int:
    out = shapes.get(n.output[0]) if n.output else None
    out_elems = math.prod(out) if out else 0
    if n.op_type in _GEMM:
        a = shapes.get(n.input[0])
        if not a or out is None:
            return out_elems
        k = a[-1]
        if n.op_type == "Gemm":
            trans_a = next((at.i for at in n.attribute if at.name == "transA"), 0)
            k = a[0] if trans_a else a[-1]
        return 2 * out_elems * k
    if n.op_type in _CONV:
        wi = _WEIGHT_INPUT.get(n.op_type, 1)
        w = shapes.get(n.input[wi]) if len(n.input) > wi else None
        if not w or out is None:
            return out_elems
        group = next((at.i for at in n.attribute if at.name == "group"), 1)
        per_out = math.prod(w[1:]) if n.op_type != "ConvTranspose" else w[0] // max(group, 1) \
            * math.prod(w[2:])
        return 2 * out_elems * per_out
    return out_elems * _ELEMENTWISE_COST.get(n.op_type, 1)
