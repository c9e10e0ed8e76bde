"""ONNX graph helpers shared by the partitioner and the onnxruntime backend: subgraphs and the
outer-scope tensors they read, and cutting a sub-model out by boundary tensor names.

``onnx.utils.Extractor`` cannot be used for cutting: it needs ``value_info`` for the cut
tensors, re-runs shape inference on the whole model for every cut, and ignores the tensors an
``If``/``Loop`` body reads from the enclosing graph, so a cut through such a model loses them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import onnx
from onnx import helper


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held by a node's attributes (``If`` branches, ``Loop``/``Scan`` bodies)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def implicit_inputs(node: onnx.NodeProto) -> list[str]:
    """Outer-scope tensors a node's subgraphs read: inputs of the node in all but name."""
    out: list[str] = []
    for g in subgraphs(node):
        local = {i.name for i in g.input} | {i.name for i in g.initializer}
        for n in g.node:
            local.update(o for o in n.output if o)
        for n in g.node:
            for t in [*n.input, *implicit_inputs(n)]:
                if t and t not in local and t not in out:
                    out.append(t)
    return out


class CutError(ValueError):
    """The boundary names do not describe a self-contained piece of the graph."""


def cut(model: onnx.ModelProto, inputs: Sequence[str], outputs: Sequence[str]
        ) -> onnx.ModelProto:
    """The sub-model computing ``outputs`` from ``inputs``: the nodes needed, the
    initializers they read, and value infos from ``model`` (which must type every boundary
    tensor: a graph made concrete for its input shapes does)."""
    g = model.graph
    producer = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    inits = {i.name: i for i in g.initializer}
    graph_inputs = {i.name for i in g.input}
    stop = set(inputs)
    keep: set[int] = set()
    seen: set[str] = set()
    todo = list(outputs)
    while todo:
        t = todo.pop()
        if t in seen or t in stop:
            continue
        seen.add(t)
        k = producer.get(t)
        if k is None:
            if t not in inits and t in graph_inputs:
                raise CutError(f"the segment needs graph input {t!r}, which is not one of its "
                               "inputs")
            continue
        if k not in keep:
            keep.add(k)
            n = g.node[k]
            todo.extend(x for x in [*n.input, *implicit_inputs(n)] if x)
    nodes = [g.node[k] for k in sorted(keep)]
    read = {x for n in nodes for x in [*n.input, *implicit_inputs(n)] if x}
    infos = {vi.name: vi for vi in [*g.input, *g.value_info, *g.output]}
    missing = [t for t in [*inputs, *outputs] if t not in infos]
    if missing:
        raise CutError(f"no type/shape for boundary tensor(s) {missing[:3]}")
    produced = {o for n in nodes for o in n.output}
    graph = helper.make_graph(
        nodes, f"{g.name or 'graph'}_cut",
        [infos[t] for t in inputs], [infos[t] for t in outputs],
        initializer=[inits[t] for t in inits if t in read and t not in stop],
        value_info=[infos[t] for t in infos
                    if t in produced and t not in set(outputs) and t not in graph_inputs])
    sub = helper.make_model(graph, opset_imports=list(model.opset_import),
                            ir_version=model.ir_version, producer_name="edgepilot-cut")
    sub.functions.extend(model.functions)
    return sub
