"""What a segment's drift says about the costs of its target, and of the targets beside it.

A segment that runs slower than it did when its plan was installed scales its target's costs
by the ratio observed, and the plan is chosen again on them (``ModelDispatch.replan``). That
reading holds when the target itself slowed (a clock down, a delegate's memory pressure). When
other work took the CPUs meanwhile, every target on those CPUs slowed alike, though only the
one serving was seen to: scaling it alone made the others look faster, the replan moved to one
of them, that one drifted in turn, and the plan changed three times in four seconds under a
load test. Then every target of the drifted one's device is scaled by the ratio (the
device's median, when several of its segments drifted), which keeps their order: the replan
keeps the plan and the monitor expects the new pace.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from edgepilot.dispatch.measuring.contention import CONTENDED
from edgepilot.dispatch.planning.plan import CostBuilder, device_of


def apply_drift(builder: CostBuilder, drifted: list[tuple[str, float]],
                contention: float) -> list[str]:
    """Scale ``builder.factors`` for ``drifted`` (target, observed/expected ratio) segments;
    ``contention`` is other work's share of the CPUs meanwhile. Returns the log lines."""
    lines = []
    if contention <= CONTENDED:
        for target, ratio in drifted:
            builder.factors[target] = builder.factors.get(target, 1.0) * ratio
            lines.append(f"{target} drifted (x{ratio:.2f})")
        return lines
    by_device: dict[str, list[float]] = defaultdict(list)
    for target, ratio in drifted:
        by_device[device_of(target)].append(ratio)
    for device, ratios in by_device.items():
        ratio = statistics.median(ratios)
        hit = [t for t in builder.profile.targets if device_of(t) == device]
        for t in hit:
            builder.factors[t] = builder.factors.get(t, 1.0) * ratio
        lines.append(f"{device} drifted (x{ratio:.2f}) while other work took "
                     f"{contention:.0%} of the CPUs: every {device} target scaled alike "
                     f"({len(hit)})")
    return lines
