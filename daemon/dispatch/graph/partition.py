"""Cut a model into layers: contiguous node ranges at points where few tensors cross.

Nodes are taken in topological (file) order. After each node the *live set* is the set of
non-constant tensors produced so far (or fed in) that a later node or the model output still
needs; a cut is allowed where the live set is as small as the graph gets (one tensor in a chain
or after a residual Add), side tensors a fraction of the main activation's size (masks,
positions) not counted. Tiny layers are then coalesced with a neighbour, because a layer that
takes less time than a hop between runtimes can never pay for moving it.

Each :class:`Layer` carries FLOPs, weight bytes, boundary bytes and op types: the features the
cost model predicts from. :class:`Partition` turns a layer range into a backend ``Segment``; the
full range is the whole model, so an all-one-target plan compiles exactly the original file.
"""

from __future__ import annotations

import functools
import itertools
import logging
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgepilot.backends.base import Backend, ModelKind, Segment, Target
from edgepilot.errors import ModelError, PlanError
from edgepilot.formats import files
from edgepilot.formats.graph_node import Node

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # onnx is imported only for ONNX models
    from edgepilot.dispatch.graph.onnx_shapes import ConcreteGraph

# TFLite operators that keep state across invocations inside the interpreter
STATEFUL_TFLITE_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"})


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
    # the input shapes the layers were cut and sized for, and the file partial segments are
    # cut from (an ONNX copy annotated for those shapes; the model file itself for TFLite)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    graph_path: Path | None = None
    # the ONNX copy ``graph_path`` is still to be written (see ``partition``'s ``lazy``)
    pending: ConcreteGraph | None = field(default=None, repr=False, compare=False)
    _graph_lock: threading.Lock = field(default_factory=threading.Lock, repr=False,
                                        compare=False)
    # a TFLite file of several signatures: the one planned and served (subgraph 0, what the
    # interpreter runs by default) and the others, which are not
    signatures: dict[str, Any] | None = None
    # a shell: layers named by a plan a board of the same kind published, cut from nothing
    # yet (graph/shell.py); this makes the real partition, on the first need of the layers'
    # contents (``real``)
    make_real: Callable[[], Partition] | None = field(default=None, repr=False, compare=False)
    # state kept inside the runtime between calls (a TFLite file's variable tensors): every
    # check starts from a freshly built one, never from a session that ran before
    stateful: bool = False

    def real(self) -> None:
        """Make a shell the real partition (in place; nothing for a real one): the model's own
        cut, merged into the shell's layer names. Raises :class:`LayerMismatch` when the names
        are no coarsening of this board's layers (the shell stays a shell)."""
        make = self.make_real
        if make is None:
            return
        got = make()
        names = [lay.name for lay in self.layers]
        if not merge_to(got, names):
            raise LayerMismatch(
                f"layer boundaries differ: {len(names)} layers published, the model file cuts "
                f"into {len(got.layers)} here ({got.layers[0].name} ...)", field="layers")
        self.layers, self.nodes, self.tensor_bytes = got.layers, got.nodes, got.tensor_bytes
        self.graph_path, self.pending, self.make_real = got.graph_path, got.pending, None

    def write_graph(self) -> None:
        """Write the annotated graph copy if it is not written yet (idempotent)."""
        with self._graph_lock:
            if self.pending is not None:
                self.pending.write()
                self.pending = None

    def release_graph(self) -> None:
        """Drop the unwritten copy from memory: a plan that runs the whole file may never cut
        a segment; the first one a later replan cuts makes the copy again."""
        with self._graph_lock:
            if self.pending is not None:
                self.pending.model = None

    def segment(self, start: int, end: int) -> Segment:
        """The segment running layers ``[start, end)``; the full range is the whole model."""
        if not 0 <= start < end <= len(self.layers):
            raise PlanError(f"layer range [{start}, {end}) outside 0..{len(self.layers)}",
                            field="layers")
        name = f"{self.model_path.stem}[{start}:{end}]"
        if start == 0 and end == len(self.layers):
            return Segment(self.model_path, self.kind, self.inputs, self.outputs, None, name)
        self.real()
        self.write_graph()
        ins, outs = range_io(self.nodes, self.layers[start].start, self.layers[end - 1].end,
                             self.outputs)
        return Segment(self.graph_path or self.model_path, self.kind, ins, outs, (start, end),
                       name)

    def boundary_bytes(self, i: int) -> int:
        """Bytes crossing the cut before layer ``i`` (0 < i < len(layers))."""
        return self.layers[i].in_bytes


class LayerMismatch(PlanError):
    """A shell's published layer names are not how this board cuts the model file."""


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


def crossing(live: set[str], tensor_bytes: dict[str, int]) -> int:
    """How many tensors really cross a cut: small side tensors that travel along the whole
    graph (an attention mask, positions, shape values) are not counted next to the main
    activation, or an encoder would have no cut between its blocks; a tensor counts when it
    is at least a quarter of the largest one crossing."""
    sizes = [tensor_bytes.get(t, 0) for t in live]
    if not sizes:
        return 0
    biggest = max(sizes)
    return sum(1 for b in sizes if 4 * b >= biggest) if biggest else len(sizes)


def build_layers(nodes: Sequence[Node], graph_inputs: Sequence[str],
                 graph_outputs: Sequence[str], tensor_bytes: dict[str, int],
                 min_layer_flops: int | None = None, max_layers: int = 48) -> list[Layer]:
    """Cut ``nodes`` at minimal live sets, then coalesce layers below ``min_layer_flops``.

    ``min_layer_flops`` defaults to 1% of the model's FLOPs; it is raised until at most
    ``max_layers`` layers remain (profiling time grows with the layer count).
    """
    if not nodes:
        raise PlanError("the model has no operators to partition", field="model")
    live = [crossing(s, tensor_bytes) for s in live_sets(nodes, graph_outputs)]
    floor = min(live[:-1]) if len(nodes) > 1 else 1
    cuts = [k + 1 for k in range(len(nodes) - 1) if live[k] <= max(1, floor)]
    bounds = [0, *cuts, len(nodes)]
    ranges = list(itertools.pairwise(bounds))
    total = sum(n.flops for n in nodes)
    threshold = min_layer_flops if min_layer_flops is not None else max(1, total // 100)
    ranges = _coalesce(ranges, nodes, threshold)
    while len(ranges) > max_layers:
        threshold *= 2
        ranges = _coalesce(ranges, nodes, threshold)
    return layers_of(nodes, ranges, graph_outputs, tensor_bytes)


def layers_of(nodes: Sequence[Node], ranges: Sequence[tuple[int, int]],
              graph_outputs: Sequence[str], tensor_bytes: dict[str, int]) -> list[Layer]:
    """One :class:`Layer` per node range, with its cost-model features."""
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


def merge_layers(part: Partition, first: int) -> None:
    """Join layers ``first`` and ``first + 1`` into one (in place): a layer that no target can
    run alone (an operator whose input must be a constant, a custom op only a whole-file
    interpreter resolves) runs together with its neighbour."""
    ranges = [(lay.start, lay.end) for lay in part.layers]
    ranges[first:first + 2] = [(ranges[first][0], ranges[first + 1][1])]
    part.layers = layers_of(part.nodes, ranges, part.outputs, part.tensor_bytes)


def merge_all(part: Partition) -> None:
    """Join every layer into one (in place): the model planned whole."""
    if len(part.layers) > 1:
        ranges = [(part.layers[0].start, part.layers[-1].end)]
        part.layers = layers_of(part.nodes, ranges, part.outputs, part.tensor_bytes)


def merge_to(part: Partition, names: Sequence[str]) -> bool:
    """Merge adjacent layers of ``part`` (in place) until their names are ``names``: the
    layers a board of the same kind ended with after merging those its reference could not
    run alone. False, ``part`` unchanged, when ``names`` is no such coarsening."""
    before = part.layers
    i = 0
    while i < len(part.layers) and i < len(names):
        if part.layers[i].name == names[i]:
            i += 1
        elif i + 1 < len(part.layers):
            merge_layers(part, i)
        else:
            break
    if [lay.name for lay in part.layers] != list(names):
        part.layers = before
        return False
    return True


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
              shapes: Mapping[str, tuple[int, ...]] | None = None,
              cache_dir: Path | None = None,
              feed: Mapping[str, np.ndarray] | None = None,
              min_layer_flops: int | None = None, max_layers: int = 48,
              lazy: bool = False) -> Partition:
    """Partition an ONNX or TFLite file into layers (kind from the extension when None).

    ``shapes`` are the plan's concrete input shapes (default: the file's own, which must then
    be fixed). ONNX graphs are first made concrete for them (written under ``cache_dir``; a
    temporary directory when None), ``feed`` being one realistic input of those shapes for
    graphs whose tensor shapes only a run can tell. ``lazy``: a new concrete copy is written
    when the first partial segment is cut, not before (a plan adopted from a board of the
    same kind often runs the whole file; the caller calls ``release_graph`` once planned).
    """
    path = Path(path)
    if kind is None:
        kinds: dict[str, ModelKind] = {".onnx": "onnx", ".tflite": "tflite", ".gguf": "gguf"}
        kind = kinds.get(path.suffix.lower())
    digest = files.sha256_of(path)
    graph_path: Path | None = None
    pending: ConcreteGraph | None = None
    signatures: dict[str, Any] | None = None
    stateful = False
    if kind == "onnx":
        from edgepilot.dispatch.graph.onnx_layers import nodes_of
        from edgepilot.dispatch.graph.onnx_shapes import concrete_graph
        from edgepilot.formats.io import tensor_specs

        if shapes is None:
            from edgepilot.dispatch.graph.signature import resolve_shapes

            try:
                specs = tensor_specs(path, "onnx")[0]
            except ModelError as exc:
                raise PlanError(exc.message, field="model") from None
            shapes = resolve_shapes(path.stem, specs, {})
        if cache_dir is None:
            cache_dir = Path(tempfile.mkdtemp(prefix="edgepilot-graphs-"))
        graph = concrete_graph(path, digest, dict(shapes), cache_dir, feed, write=False)
        graph_path = graph.path
        nodes, ins, outs, sizes = nodes_of(graph.load(), graph.tensors)
        if graph.opaque:
            # a sequence (or an absent optional) between two nodes cannot cross from one
            # segment to the next: the model runs whole, its best target picked as for any
            log.info("%s: %d values are no tensors (e.g. %r): planned whole", path.name,
                     len(graph.opaque), sorted(graph.opaque)[0])
            sizes.update(dict.fromkeys(graph.opaque, 0))
            max_layers = 1
        if graph.model is not None:
            graph.rebuild = functools.partial(concrete_graph, path, digest, dict(shapes),
                                              cache_dir, feed)
            pending = graph
            if not lazy:
                graph.write()
    elif kind == "tflite":
        from edgepilot.dispatch.graph.tflite_layers import default_shapes, read_tflite
        from edgepilot.formats.tflite_graph import has_variable_tensors, signature_keys

        shapes = dict(shapes) if shapes else default_shapes(path)
        nodes, ins, outs, sizes = read_tflite(path, shapes)
        served, keys = signature_keys(path)
        if len(keys) > 1:
            signatures = {"served": served, "others": [k for k in keys if k != served]}
        stateful = any(n.op in STATEFUL_TFLITE_OPS for n in nodes) or has_variable_tensors(path)
        if stateful:
            # resource variables live in one interpreter and CALL_ONCE initialises them all;
            # variable tensors (an LSTM's state kept between invokes) live in it too: a
            # streaming model runs whole, and the plan picks its best target
            max_layers = 1
    else:
        raise PlanError(f"{path.name}: per-layer planning covers ONNX and TFLite models; "
                        f"allowed extensions: .onnx, .tflite (GGUF is planned by n_gpu_layers)",
                        field="model")
    if not nodes:  # the raw runtime passes its inputs through: no layer to plan
        raise PlanError(f"{path.name} has no operators (its outputs are its inputs or "
                        "constants): nothing to plan; the daemon serves the file as it is",
                        field="model")
    made = {t for n in nodes for t in n.outputs}
    constant = [o for o in outs if o not in made and o not in ins]
    if constant and max_layers > 1:
        # an output no operator makes (a length computed from input shapes, folded into a
        # constant once the shapes are fixed: NeMo's MarbleNet ``signal_len``) is produced by
        # the whole file only, which no segment but the whole model is
        log.info("%s: output %r is a constant at these shapes: planned whole", path.name,
                 constant[0])
        max_layers = 1
    layers = build_layers(nodes, ins, outs, sizes, min_layer_flops, max_layers)
    return Partition(path, kind, digest, tuple(ins), tuple(outs), layers,
                     list(nodes), sizes, dict(shapes or {}), graph_path,
                     pending if lazy else None, signatures=signatures,
                     stateful=kind == "tflite" and stateful)


def covers_any(backend: Backend, part: Partition, target: Target) -> bool:
    """Whether ``target`` runs the whole model or at least one of its layers."""
    if not backend.takes(part.kind):  # asks nothing of a lazy partition's graph copy
        return False
    if backend.supports(part.segment(0, len(part.layers)), target):
        return True
    return any(backend.supports(part.segment(i, i + 1), target) for i in range(len(part.layers)))
