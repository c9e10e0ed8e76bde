"""TFLite graphs as partitioner nodes, read through the flatbuffer helpers
(:mod:`edgepilot.formats.tflite_graph`); FLOPs for the GEMM/conv operators, sizes from shapes.

A file's tensors carry the shapes of its default input shapes (batch 1 for a file whose
``shape_signature`` leaves the batch dynamic). For other input shapes, the sizes come from the
TFLite interpreter itself, resized to them: its own shape propagation, no guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgepilot.formats import tflite_graph
from edgepilot.formats.file_cache import per_file
from edgepilot.formats.graph_node import Node

# operators that only unpack a constant (fp16 weights -> fp32, a sparse weight -> dense): their
# output is a weight of the operator reading it, never a tensor to cut at or hand over (XNNPACK
# refuses a convolution whose weights arrive as a runtime input)
WEIGHT_OPS = frozenset({"DEQUANTIZE", "DENSIFY"})
_ITEMSIZE = {"FLOAT32": 4, "FLOAT16": 2, "INT32": 4, "UINT8": 1, "INT64": 8, "BOOL": 1,
             "INT16": 2, "INT8": 1, "FLOAT64": 8}


def _shape(tensor: Any) -> list[int]:
    return [max(int(d), 1) for d in (tensor.shape if tensor.shape is not None else [])]


def default_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The input shapes the file allocates without any resize.

    Asked on every request to a TFLite model (its signature): kept per (file, mtime, size),
    since parsing the flatbuffer again costs milliseconds when two models alternate.
    """
    return dict(_default_shapes(path))


@per_file()
def _default_shapes(path: Path) -> tuple[tuple[str, tuple[int, ...]], ...]:
    sg = tflite_graph.load(path).subgraphs[0]
    return tuple((tflite_graph._name(sg.tensors[i]), tuple(_shape(sg.tensors[i])))
                 for i in tflite_graph._ints(sg.inputs))


def read_tflite(path: Path, shapes: Mapping[str, tuple[int, ...]] | None = None
                ) -> tuple[list[Node], list[str], list[str], dict[str, int]]:
    """Operators in file order, model inputs/outputs and bytes per tensor name."""
    model = tflite_graph.load(path)
    sg = model.subgraphs[0]
    types = {v: k for k, v in vars(tflite_graph.schema().TensorType).items()
             if not k.startswith("_")}
    shapes_now: dict[str, list[int]] = {tflite_graph._name(t): _shape(t) for t in sg.tensors}
    if shapes and dict(shapes) != default_shapes(path):
        from edgepilot.backends.tflite import tensor_shapes

        shapes_now.update({k: list(v) for k, v in tensor_shapes(path, shapes).items()})
    sizes: dict[str, int] = {}
    for t in sg.tensors:
        name = tflite_graph._name(t)
        sizes[name] = math.prod(shapes_now[name]) * _ITEMSIZE.get(types.get(t.type, ""), 4)
    nodes: list[Node] = []
    folded: dict[str, int] = {}  # unpacked weight -> bytes of the constant it unpacks
    for layer, op in zip(tflite_graph.layers(path), sg.operators or [], strict=True):
        tensors = [sg.tensors[i] for i in tflite_graph._ints(op.inputs) if i >= 0]
        consts = [t for t in tensors if tflite_graph._is_const(model, t)]
        reads = [tflite_graph._name(t) for t in tensors]
        wbytes = sum(sizes[tflite_graph._name(t)] for t in consts) + sum(
            folded[t] for t in reads if t in folded)
        if layer.op in WEIGHT_OPS and all(t in folded for t in layer.inputs):
            folded.update({o: wbytes for o in layer.outputs})
            continue  # cut() takes it along with the operator that reads its output
        layer = tflite_graph.Layer(layer.index, layer.op,
                                   tuple(t for t in layer.inputs if t not in folded),
                                   layer.outputs)
        weights = [list(shapes_now[tflite_graph._name(t)]) for t in tensors
                   if (t in consts or tflite_graph._name(t) in folded)
                   and len(shapes_now[tflite_graph._name(t)]) >= 2]
        out_elems = sum(math.prod(shapes_now[o]) for o in layer.outputs)
        flops = out_elems
        if layer.op == "FULLY_CONNECTED" and weights:
            flops = 2 * out_elems * weights[0][-1]
        elif layer.op in ("CONV_2D", "DEPTHWISE_CONV_2D") and weights:
            w = weights[0]
            per_out = math.prod(w[1:]) if layer.op == "CONV_2D" else math.prod(w[1:3])
            flops = 2 * out_elems * per_out
        nodes.append(Node(f"{layer.op}_{layer.index}", layer.op, layer.inputs, layer.outputs,
                          flops, wbytes))
    ins, outs = tflite_graph.io_names(path)
    return nodes, list(ins), list(outs), sizes
