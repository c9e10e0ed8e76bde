"""The document a made plan is cached and published as (``cache.py``, ``shared.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgepilot.dispatch.measuring.cells import LatencyTable
from edgepilot.dispatch.measuring.digest import tensors_sha256
from edgepilot.dispatch.planning.plan import CostBuilder, Plan


def plan_document(name: str, parts: Mapping[str, Any], builder: CostBuilder,
                  profile: LatencyTable, plan: Plan, *, signature: str, targets: list[str],
                  segment_ms: list[float], fastest: list[float],
                  calibration: Sequence[Mapping[str, np.ndarray]],
                  outputs_sha256: str | None) -> dict[str, Any]:
    """Everything a restart (or a board of the same kind) needs to serve ``plan`` without
    profiling again: the profile, layers forced to a target, the plan and how it ran."""
    part = builder.part
    return {"model": name, "parts": dict(parts), "profile": profile.as_dict(),
            "forced": {str(k): v for k, v in builder.forced.items()},
            "plan": plan.as_dict(), "model_sha256": part.model_hash,
            "signature": signature, "layers": [lay.name for lay in part.layers],
            "targets": targets, "segment_ms": segment_ms, "planning_s": plan.planning_s,
            "fastest_ms": fastest or None,
            # what lets a board of this kind skip building the reference (digest.py)
            "inputs_sha256": tensors_sha256(list(calibration)),
            "outputs_sha256": outputs_sha256}
