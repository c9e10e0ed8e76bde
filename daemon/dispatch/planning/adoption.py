"""Before a plan is made: the model's partition, the targets that run it, and either a plan a
board of the same kind published (with its reference run here) or this board's own reference.

Adopting skips the reference search and the layer-by-layer runs that find the layers the
reference cannot run alone: the partition's layers are merged into the published ones (which
is accepted only when it gives the same layers), and the reference is the one the publisher
found, run here on the whole model (its outputs are what the plan's output error is checked
against). A published plan that runs the whole ONNX file on one target is adopted on a shell
partition (``graph/shell.py``): its layer names checked against the raw file, the graph made
concrete only when a replan needs the layers.

Such a plan on a target other than the reference does not even build the reference when the
publisher's digests vouch for it (``measuring/digest.py``): the same calibration inputs, and
the plan's outputs here hash as the publisher's did. The reference's outputs are then made
only if something asks for them (a replan, or a digest that differs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgepilot.backends.base import Backend, Executable, ModelKind, Target
from edgepilot.dispatch.graph.partition import (
    LayerMismatch,
    Partition,
    covers_any,
    merge_to,
    partition,
)
from edgepilot.dispatch.graph.shell import shell, whole_file, whole_outline
from edgepilot.dispatch.graph.signature import Shapes, signature_of
from edgepilot.dispatch.measuring.digest import tensors_sha256
from edgepilot.dispatch.measuring.output_check import OutputCheck
from edgepilot.dispatch.measuring.runnable import (
    Feed,
    Reference,
    budget_first,
    published_reference,
    reference_for,
    reference_named,
    reference_outputs,
)
from edgepilot.dispatch.planning.shared import PlanExchange, published_segments
from edgepilot.formats import files


@dataclass
class Start:
    """What planning starts from."""

    part: Partition
    targets: list[Target]      # those that run the whole model or some of its layers
    adopted: dict[str, Any] | None  # the published plan to adopt (None: plan here)
    ref: Target                # the reference target
    # the reference's outputs on the calibration inputs (on the first only when ``budgeted``);
    # None: not made yet (``vouched``), ``outputs_of`` makes them when asked
    ref_outputs: list[Feed] | None
    merges: list[str]          # layers the reference could not run alone, merged (planned here)
    # the reference's executable, open, when the adopted plan runs the whole model on it
    spare: Executable | None = None
    # the published plan's outputs digest and output error, when they stand for the check
    vouched: tuple[str, float] | None = None
    outputs_of: Callable[[], list[Feed]] = field(default=lambda: [])
    ref_ms: list[float] = field(default_factory=list)  # the reference's run of each input
    budgeted: bool = False  # planned whole for the planning budget (measuring/budget.py)

    def profile_inputs(self, feeds: list[Feed]) -> tuple[list[Feed], list[Feed] | None,
                                                         list[float]]:
        """The calibration inputs the profile runs, with the reference's outputs and runs on
        them: a model planned whole in the budget is profiled on the first only (the
        reference ran no other; the plan's check runs them all)."""
        if self.budgeted:
            return feeds[:1], (self.ref_outputs or [])[:1] or None, self.ref_ms[:1]
        return feeds, self.ref_outputs, self.ref_ms

    def output_check(self, feeds: list[Feed], metric: str) -> OutputCheck:
        """How the plan's outputs are checked on ``feeds`` (see :class:`OutputCheck`)."""
        if self.budgeted:  # the reference's outputs on the other inputs made if a plan asks
            made = self.ref_outputs if len(self.ref_outputs or []) == len(feeds) else None
            return OutputCheck(feeds, metric, made, self.outputs_of, same_as=str(self.ref))
        return OutputCheck(feeds, metric, self.ref_outputs, self.outputs_of, self.vouched)

    @property
    def shell_of(self) -> dict[str, Any] | None:
        """The published plan when it is adopted on a shell partition (its layers not cut)."""
        return self.adopted if self.part.make_real is not None else None


def begin(exchange: PlanExchange | None, parts: Mapping[str, Any], path: Path, kind: ModelKind,
          shapes: Shapes, backends: Mapping[str, Backend], targets: Sequence[Target],
          feeds: Sequence[Feed], *, cache_dir: Path | None, max_layers: int,
          budget_s: float = 0.0) -> Start:
    """Partition the model for ``shapes`` (``partition``'s ``cache_dir`` and ``max_layers``),
    then adopt from ``exchange`` (None: plan here) or find the reference (``budget_s``: the
    planning budget, ``measuring/budget.py``). A published plan running the whole ONNX file
    is adopted on a shell partition, the model not cut."""
    make = functools.partial(partition, path, kind, shapes=shapes, cache_dir=cache_dir,
                             feed=feeds[0], max_layers=max_layers, lazy=True)
    part, signature = None, signature_of(shapes)
    doc = exchange.peek(parts, files.sha256_of(path), signature) \
        if exchange is not None and kind == "onnx" else None
    if doc is not None and whole_file(doc):
        part = shell(path, files.sha256_of(path), shapes, doc["layers"], make)
    known = None
    if doc is None and kind == "onnx" and budget_s > 0:
        # the reference's run decides the budget before a cut and its shape probe are paid
        whole = whole_outline(path, files.sha256_of(path), shapes)
        here = usable(whole, backends, targets) if whole is not None else []
        known = budget_first(whole, backends, here, feeds, budget_s) \
            if whole is not None and here else None
        if whole is not None and known is not None and known.budgeted:
            return Start(whole, here, None, known.target, known.outputs, known.merges,
                         known.spare, ref_ms=known.ms, budgeted=True,
                         outputs_of=functools.partial(reference_outputs, whole, backends,
                                                      here, feeds, str(known.target)))
    try:
        return _begin(exchange, parts, signature, part or make(), backends, targets, feeds,
                      budget_s, known)
    except LayerMismatch as exc:  # only a shell raises it: refused, as a real cut would be
        assert exchange is not None and doc is not None
        exchange.drop(doc, exc.message, model_sha256=files.sha256_of(path))
        return _begin(exchange, parts, signature, make(), backends, targets, feeds, budget_s)


def usable(part: Partition, backends: Mapping[str, Backend], targets: Sequence[Target]
           ) -> list[Target]:
    """Every target of a backend that takes this kind of model and runs some of it: one that
    covers only some layers (a delegate) is a planning fact, used for the layers it covers."""
    return [t for t in targets if t.backend in backends and covers_any(backends[t.backend],
                                                                      part, t)]


def _begin(exchange: PlanExchange | None, parts: Mapping[str, Any], signature: str,
           part: Partition, backends: Mapping[str, Backend], targets: Sequence[Target],
           feeds: Sequence[Feed], budget_s: float = 0.0, known: Reference | None = None
           ) -> Start:
    here = usable(part, backends, targets)
    found = adoptable(exchange, parts, part, signature, backends, here, feeds) \
        if exchange is not None else None
    if found is not None:
        if known is not None and known.spare is not None:
            known.spare.close()  # the publisher's reference is the one run
        doc, ref, outputs, spare, vouched = found
        start = Start(part, here, doc, ref, outputs, [], spare, vouched)
        if vouched is not None:
            start.outputs_of = functools.partial(reference_outputs, part, backends, here,
                                                 feeds, str(ref))
        return start
    if part.make_real is not None:  # a shell whose plan was refused (its one event): cut it
        return _begin(None, parts, signature, part.make_real(), backends, targets, feeds,
                      budget_s)
    if known is not None and known.target not in here:  # not this cut's: found again
        if known.spare is not None:
            known.spare.close()
        known = None
    found_ref = reference_for(part, backends, here, feeds, budget_s, known)
    return Start(part, here, None, found_ref.target, found_ref.outputs, found_ref.merges,
                 found_ref.spare, ref_ms=found_ref.ms, budgeted=found_ref.budgeted)


def adoptable(exchange: PlanExchange, parts: Mapping[str, Any], part: Partition,
              signature: str, backends: Mapping[str, Backend], targets: list[Target],
              feeds: Sequence[Feed]
              ) -> tuple[dict[str, Any], Target, list[Feed] | None, Executable | None,
                         tuple[str, float] | None] | None:
    """A published plan for this model, its reference target, that target's outputs on
    ``feeds`` here (None: not made), its executable when the plan runs the whole model on it
    (one session built, not two), and the publisher's (outputs digest, output error) when they
    vouch for the plan's check instead of those outputs; None: this board plans as usual.
    ``part``'s layers are merged (in place) into the published ones."""
    before = part.layers
    doc = exchange.find(parts, part.model_hash, signature, [], [str(t) for t in targets],
                        fits=lambda names: merge_to(part, names))
    if doc is None:
        return None
    name = str(doc["profile"]["reference"])
    segments = published_segments(doc)
    vouched = _vouch(doc, feeds) if len(segments) == 1 and segments[0][0] != name else None
    ref = reference_named(part, targets, name) if vouched is not None else None
    if ref is not None:  # checked against the digest once the plan has run
        return doc, ref, None, None, vouched
    got = published_reference(part, backends, targets, feeds, name,
                              keep=len(segments) == 1 and segments[0][0] == name)
    if got is None:
        part.layers = before
        exchange.drop(doc, f"its reference {name} is not one here or does not run the "
                      "whole model here", model_sha256=part.model_hash)
        return None
    return (doc, *got, None)


def _vouch(doc: Mapping[str, Any], feeds: Sequence[Feed]) -> tuple[str, float] | None:
    """The publisher's (outputs digest, output error) when they apply here: made on these
    very inputs (None: they do not, or the plan published none)."""
    try:
        digest, error = doc.get("outputs_sha256"), float(doc["plan"]["error"])
    except (TypeError, ValueError, KeyError):
        return None
    if not digest or error < 0 or doc.get("inputs_sha256") != tensors_sha256(feeds):
        return None
    return str(digest), error
