"""A plan's output check: its error against the reference on the calibration inputs.

The reference's outputs may be made late: a plan adopted from a board of the same kind whose
outputs here hash as the publisher's did (``digest.py``) has the publisher's error, so its
first check needs no reference; any later check (a replan, a repair) makes the outputs then.
The digest of the last plan checked is kept for what this board publishes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from edgepilot.dispatch.execution.executor import CompiledPlan
from edgepilot.dispatch.measuring.digest import tensors_sha256
from edgepilot.dispatch.measuring.tolerance import output_error

Feed = dict[str, np.ndarray]


class OutputCheck:
    """Checks plans against the reference's outputs on ``feeds`` in ``metric``."""

    def __init__(self, feeds: Sequence[Feed], metric: str,
                 ref_outputs: list[Feed] | None = None,
                 outputs_of: Callable[[], list[Feed]] = lambda: [],
                 vouched: tuple[str, float] | None = None, same_as: str | None = None) -> None:
        """``ref_outputs`` None: made by ``outputs_of`` when first needed; ``vouched``: a
        published plan's (outputs digest, output error), standing for the first check;
        ``same_as``: the reference target, whose whole model as a plan computes the reference's
        outputs themselves: error 0, nothing run (a model planned whole in the budget, whose
        calibration inputs may take minutes: a TTS model's second ran 85 s)."""
        self.feeds, self.metric = list(feeds), metric
        self._ref, self._outputs_of, self._vouched = ref_outputs, outputs_of, vouched
        self._same_as = same_as
        self._last: tuple[CompiledPlan, str] | None = None

    @property
    def ref_outputs(self) -> list[Feed]:
        """The reference's outputs on the calibration inputs (made on first use)."""
        if self._ref is None:
            self._ref = self._outputs_of()
        return self._ref

    @property
    def reference_made(self) -> bool:
        """Whether the reference's outputs exist yet (False while a digest stood for them)."""
        return self._ref is not None

    def error(self, plan: CompiledPlan) -> float:
        """The plan's worst output error; the vouched error when its outputs hash as the
        publisher's did (first check only)."""
        if self._same_as is not None and len(plan.segments) == 1 \
                and plan.segments[0].segment.is_whole and plan.segments[0].target == self._same_as:
            self._last = None
            return 0.0
        # the reference ran the inputs in this order from a fresh build: a stateful model's
        # outputs follow what ran before (its timing runs, say), so it starts fresh too
        plan.reset_state()
        outs = [plan.run(feed)[0] for feed in self.feeds]
        digest = tensors_sha256(outs)
        self._last = (plan, digest)
        vouched, self._vouched = self._vouched, None
        if vouched is not None and vouched[0] == digest:
            return vouched[1]
        return max(output_error(out, ref, self.metric)
                   for out, ref in zip(outs, self.ref_outputs, strict=True))

    def digest_of(self, plan: CompiledPlan) -> str | None:
        """The outputs digest of ``plan`` when it was the last one checked (else None)."""
        return self._last[1] if self._last is not None and self._last[0] is plan else None
