"""What a segment's drift says about the costs of its target, and of the targets beside it.

A segment that runs slower than it did when its plan was installed scales its target's costs
by the ratio observed, and the plan is chosen again on them (``ModelDispatch.replan``). That
reading holds when the target itself slowed (a clock down, a delegate's memory pressure). When
other work took the CPUs meanwhile, every target on those CPUs slowed alike, though only the
one serving was seen to: scaling it alone made the others look faster, the replan moved to one
of them, that one drifted in turn, and the plan changed three times in four seconds under a
load test. Then the other targets of the drifted one's device are scaled too, by the ratio
(the device's median, when several of its segments drifted) as far as the load explains it:
other work taking a share ``c`` of the CPUs slows a target by up to ``1 / (1 - c)`` (one
core of two busy: 2x). A drift within that keeps the targets' order, the replan keeps the
plan and the monitor expects the new pace; a target slowed far past it (a delegate gone
bad) is slower on its own account and still loses its layers.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from edgepilot.dispatch.measuring.contention import CONTENDED
from edgepilot.dispatch.planning.plan import CostBuilder, device_of

# the most other work is taken to slow a target by (a share near 1 would explain anything)
MAX_LOAD_SLOWDOWN = 4.0


def load_slowdown(contention: float) -> float:
    """How much slower other work taking ``contention`` of the CPUs can make a CPU target."""
    return min(MAX_LOAD_SLOWDOWN, 1.0 / max(1e-6, 1.0 - contention))


def apply_drift(builder: CostBuilder, drifted: list[tuple[str, float]],
                contention: float) -> list[str]:
    """Scale ``builder.factors`` for ``drifted`` (target, observed/expected ratio) segments;
    ``contention`` is other work's share of the CPUs meanwhile. Returns the log lines."""
    lines = []
    for target, ratio in drifted:
        builder.factors[target] = builder.factors.get(target, 1.0) * ratio
        lines.append(f"{target} drifted (x{ratio:.2f})")
    if contention <= CONTENDED:
        return lines
    seen = {t for t, _ in drifted}
    by_device: dict[str, list[float]] = defaultdict(list)
    for target, ratio in drifted:
        by_device[device_of(target)].append(ratio)
    for device, ratios in by_device.items():
        ratio = min(statistics.median(ratios), load_slowdown(contention))
        if ratio <= 1.0:
            continue  # faster: no load to explain, nothing to say of the others
        hit = [t for t in builder.profile.targets if device_of(t) == device and t not in seen]
        for t in hit:
            builder.factors[t] = builder.factors.get(t, 1.0) * ratio
        lines.append(f"other work took {contention:.0%} of the CPUs meanwhile: the other "
                     f"{len(hit)} {device} targets scaled by x{ratio:.2f} too")
    return lines
