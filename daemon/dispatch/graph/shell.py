"""A partition named by a published plan, checked against the raw ONNX file, cut from nothing.

A board adopting a plan that runs the whole file on one target (what most published plans
are) needs no layer contents to serve it: the segment is the user's own file. Its layers are
bookkeeping for a later replan. Making the ONNX graph concrete for the signature (constant
folding, shape inference: 0.4 s for OpenNSFW, 1.2 s for MiniLM, most of what adopting cost) is
what cutting it needs, so a shell partition takes the published layer names instead, after a
check against a cheap view of the file: the raw ``ModelProto``'s operators, in file order,
without folding or inference. Each layer name (``L<i>:<op>:<node>``, ``partition.layers_of``)
must count up from 0 and name an operator of this file of that type, each after the last.
A replan, a cost-model fit or a partial segment makes the real partition first
(``Partition.real``), which refuses names that are no coarsening of this board's own cut.

:func:`whole_outline` is the same cheap view as one real layer: the file as a model planned
whole needs it (``measuring/budget.py``), with no cut and no shape probe, which for a TTS
model took the memory of every intermediate tensor at once (13 GB) and several of its runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgepilot.dispatch.graph.partition import Layer, Partition, layers_of

if TYPE_CHECKING:  # onnx is imported only for ONNX models
    import onnx


def named_in_file(model: onnx.ModelProto, names: Sequence[str]) -> bool:
    """Whether ``names`` are layer names of ``model``: ``L<i>:<op>:<node>`` with ``i`` counting
    from 0 and each naming an operator of type ``op`` after the previous one (an unnamed
    operator's generated name counts only where it is the same in the raw file)."""
    where: dict[str, tuple[int, str]] = {}
    for k, node in enumerate(model.graph.node):
        where.setdefault(node.name or f"{node.op_type}_{k}", (k, node.op_type))
    last = -1
    for i, name in enumerate(names):
        parts = name.split(":", 2)
        if len(parts) != 3 or parts[0] != f"L{i}":
            return False
        found = where.get(parts[2])
        if found is None or found[1] != parts[1] or found[0] <= last:
            return False
        last = found[0]
    return bool(names)


def whole_file(doc: Mapping[str, Any]) -> bool:
    """Whether a published plan (one that passed ``shared._malformed``) runs the whole file
    as one segment on one target."""
    segments = doc["plan"]["segments"]
    return len(segments) == 1 and list(segments[0]["layers"]) == [0, len(doc["layers"])]


def shell(path: Path, digest: str, shapes: Mapping[str, tuple[int, ...]],
          names: Sequence[str], make_real: Callable[[], Partition]) -> Partition | None:
    """A shell partition of the ONNX file at ``path`` with layers ``names`` (None: they are
    not this file's layer names, see :func:`named_in_file`); ``make_real`` partitions it."""
    from edgepilot.formats.onnx_outline import onnx_outline

    try:
        # the operators and the graph's inputs and outputs: no folding, no shape inference
        model = onnx_outline(path)
    except Exception:  # unreadable here: the real partition says why
        return None
    if not named_in_file(model, names):
        return None
    g = model.graph
    inits = {i.name for i in g.initializer}
    ins = tuple(vi.name for vi in g.input if vi.name not in inits)
    outs = tuple(vi.name for vi in g.output)
    # no contents: nothing plans on them before ``real`` replaces them
    layers = [Layer(i, name, 0, 0, [], (), (), 0, 0, 0, 0) for i, name in enumerate(names)]
    return Partition(path, "onnx", digest, ins, outs, layers, shapes=dict(shapes),
                     make_real=make_real)


def whole_outline(path: Path, digest: str, shapes: Mapping[str, tuple[int, ...]]
                  ) -> Partition | None:
    """The ONNX file at ``path`` as one layer, read from its outline: its operators (what
    targets' support is judged by), no tensor sizes, nothing cut or probed. None: the outline
    cannot be read here (the real partition says why)."""
    from edgepilot.dispatch.graph.onnx_layers import nodes_of
    from edgepilot.formats.onnx_outline import onnx_outline

    try:
        nodes, ins, outs, _ = nodes_of(onnx_outline(path), {})
    except Exception:  # unreadable as an outline: partitioning reports it in its words
        return None
    if not nodes:
        return None
    layers = layers_of(nodes, [(0, len(nodes))], outs, {})
    return Partition(path, "onnx", digest, tuple(ins), tuple(outs), layers, list(nodes), {},
                     dict(shapes))
