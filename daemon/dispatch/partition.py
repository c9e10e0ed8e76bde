"""Cut a model into layers: contiguous node ranges at points where few tensors cross.

Nodes are taken in topological (file) order. After each node the *live set* is the set of
non-constant tensors produced so far (or fed in) that a later node or the model output still
needs; a cut is allowed where the live set is as small as the graph gets (one tensor in a chain
or after a residual Add). Tiny layers are then coalesced with a neighbour, because a layer that
takes less time than a hop between runtimes can never pay for moving it.

Each :class:`Layer` carries FLOPs, weight bytes, boundary bytes and op types: the features the
cost model predicts from. :class:`Partition` turns a layer range into a backend ``Segment``; the
full range is the whole model, so an all-one-target plan compiles exactly the original file.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgepilot.backends.base import ModelKind, Segment
from edgepilot.errors import PlanError
from edgepilot.models import files


@dataclass(frozen=True)
class Node:
    """One graph operator, reduced to what the partitioner needs."""

    name: str
    op: str
    inputs: tuple[str, ...]   # non-constant tensors read
    outputs: tuple[str, ...]
    flops: int
    weight_bytes: int


@dataclass
class Layer:
    """A contiguous range of nodes ``[start, end)`` with the features the cost model uses."""

    index: int
    name: str
    start: int
    end: int
    op_types: list[str]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    flops: int
    weight_bytes: int
    in_bytes: int
    out_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Partition:
    """A model's layers plus what is needed to build segments from layer ranges."""

    model_path: Path
    kind: ModelKind
    model_hash: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    layers: list[Layer]
    nodes: list[Node] = field(default_factory=list, repr=False)
    tensor_bytes: dict[str, int] = field(default_factory=dict, repr=False)

    def segment(self, start: int, end: int) -> Segment:
        """The segment running layers ``[start, end)``; the full range is the whole model."""
        if not 0 <= start < end <= len(self.layers):
            raise PlanError(f"layer range [{start}, {end}) outside 0..{len(self.layers)}",
                            field="layers")
        name = f"{self.model_path.stem}[{start}:{end}]"
        if start == 0 and end == len(self.layers):
            return Segment(self.model_path, self.kind, self.inputs, self.outputs, None, name)
        ins, outs = range_io(self.nodes, self.layers[start].start, self.layers[end - 1].end,
                             self.outputs)
        return Segment(self.model_path, self.kind, ins, outs, (start, end), name)

    def boundary_bytes(self, i: int) -> int:
        """Bytes crossing the cut before layer ``i`` (0 < i < len(layers))."""
        return self.layers[i].in_bytes


def range_io(nodes: Sequence[Node], s: int, e: int,
             graph_outputs: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Tensors nodes ``[s, e)`` read from outside, and those they make that are needed later.

    The executor keeps every produced tensor until the request ends, so a tensor that skips
    over a range is neither its input nor its output.
    """
    produced: set[str] = set()
    ins: list[str] = []
    for n in nodes[s:e]:
        ins.extend(t for t in n.inputs if t not in produced and t not in ins)
        produced.update(n.outputs)
    later = {t for n in nodes[e:] for t in n.inputs} | set(graph_outputs)
    outs = [t for n in nodes[s:e] for t in n.outputs if t in later]
    return tuple(ins), tuple(outs)


def live_sets(nodes: Sequence[Node], graph_outputs: Sequence[str]) -> list[set[str]]:
    """``live[k]`` = tensors crossing the cut after node ``k``."""
    last_use: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for t in node.inputs:
            last_use[t] = k
    end = len(nodes)
    for t in graph_outputs:
        last_use[t] = end
    live: set[str] = set()
    out: list[set[str]] = []
    for k, node in enumerate(nodes):
        live.update(t for t in node.inputs if last_use.get(t, -1) > k)
        live.update(t for t in node.outputs if last_use.get(t, -1) > k)
        live = {t for t in live if last_use.get(t, -1) > k}
        out.append(set(live))
    return out


def build_layers(nodes: Sequence[Node], graph_inputs: Sequence[str],
                 graph_outputs: Sequence[str], tensor_bytes: dict[str, int],
                 min_layer_flops: int | None = None, max_layers: int = 48) -> list[Layer]:
    """Cut ``nodes`` at minimal live sets, then coalesce layers below ``min_layer_flops``.

    ``min_layer_flops`` defaults to 1% of the model's FLOPs; it is raised until at most
    ``max_layers`` layers remain (profiling time grows with the layer count).
    """
    if not nodes:
        raise PlanError("the model has no operators to partition", field="model")
    live = live_sets(nodes, graph_outputs)
    floor = min(len(s) for s in live[:-1]) if len(nodes) > 1 else 1
    cuts = [k + 1 for k in range(len(nodes) - 1) if len(live[k]) <= max(1, floor)]
    bounds = [0, *cuts, len(nodes)]
    ranges = list(itertools.pairwise(bounds))
    total = sum(n.flops for n in nodes)
    threshold = min_layer_flops if min_layer_flops is not None else max(1, total // 100)
    ranges = _coalesce(ranges, nodes, threshold)
    while len(ranges) > max_layers:
        threshold *= 2
        ranges = _coalesce(ranges, nodes, threshold)
    layers: list[Layer] = []
    for idx, (s, e) in enumerate(ranges):
        ins, outs = range_io(nodes, s, e, graph_outputs)
        chunk = nodes[s:e]
        ops = [n.op for n in chunk]
        main = max(chunk, key=lambda n: n.flops)
        layers.append(Layer(
            index=idx, name=f"L{idx}:{main.op}:{main.name}", start=s, end=e, op_types=ops,
            inputs=ins, outputs=outs, flops=sum(n.flops for n in chunk),
            weight_bytes=sum(n.weight_bytes for n in chunk),
            in_bytes=sum(tensor_bytes.get(t, 0) for t in ins),
            out_bytes=sum(tensor_bytes.get(t, 0) for t in outs)))
    return layers


def _coalesce(ranges: list[tuple[int, int]], nodes: Sequence[Node],
              threshold: int) -> list[tuple[int, int]]:
    """Merge every range under ``threshold`` FLOPs into its lighter neighbour, lightest first."""
    ranges = list(ranges)

    def flops(r: tuple[int, int]) -> int:
        return sum(n.flops for n in nodes[r[0]:r[1]])

    while len(ranges) > 1:
        costs = [flops(r) for r in ranges]
        i = min(range(len(ranges)), key=lambda j: costs[j])
        if costs[i] >= threshold:
            break
        if i == 0:
            j = 1
        elif i == len(ranges) - 1:
            j = i - 1
        else:
            j = i - 1 if costs[i - 1] <= costs[i + 1] else i + 1
        a, b = sorted((i, j))
        ranges[a:b + 1] = [(ranges[a][0], ranges[b][1])]
    return ranges


def partition(path: Path, kind: ModelKind | None = None, *,
              min_layer_flops: int | None = None, max_layers: int = 48) -> Partition:
    """Partition an ONNX or TFLite file into layers (kind from the extension when None)."""
    path = Path(path)
    if kind is None:
        kind = {".onnx": "onnx", ".tflite": "tflite", ".gguf": "gguf"}.get(path.suffix.lower())
    if kind == "onnx":
        from edgepilot.dispatch.graph_onnx import read_onnx

        nodes, ins, outs, sizes = read_onnx(path)
    elif kind == "tflite":
        from edgepilot.dispatch.graph_tflite import read_tflite

        nodes, ins, outs, sizes = read_tflite(path)
    else:
        raise PlanError(f"{path.name}: per-layer planning covers ONNX and TFLite models; "
                        f"allowed extensions: .onnx, .tflite (GGUF is planned by n_gpu_layers)",
                        field="model")
    layers = build_layers(nodes, ins, outs, sizes, min_layer_flops, max_layers)
    return Partition(path, kind, files.sha256_of(path), tuple(ins), tuple(outs), layers,
                     list(nodes), sizes)
