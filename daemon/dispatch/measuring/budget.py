"""What a model's planning can afford: ``[dispatch] planning_budget_s``.

A per-layer profile runs every layer on every target: about :data:`RUNS_PER_TARGET` runs of
the whole model per target (a calibration run for the error, a warm-up, timed runs) and two
more on the reference (its runnable check and its reference pass). A TTS model that takes
4-5 s a run on five targets comes to ~100 s of that alone, and ~270 s of planning with the
whole-model timings, the plan's check and its own timing. When the reference's run says the
per-layer profile alone would take over :data:`PROFILE_SHARE` of the budget, the model is
planned whole: each target runs the whole model (:data:`WHOLE_RUNS` timed runs), the fastest
within tolerance serves, timed as it was then, and the plan's ``merged`` notes say so. A split
could only be found by the profile the budget cannot pay for; a larger budget (or 0: none)
plans such a model per layer.
"""

from __future__ import annotations

import time

RUNS_PER_TARGET = 4.0
REFERENCE_RUNS = 2.0
# the rest of the budget: each target's whole model, the plan's check, its timing
PROFILE_SHARE = 0.5
# timed runs of each target's whole model when planned whole: a model this heavy (seconds a
# run) varies by a few percent from run to run, and a third run per target was a sixth of
# Kokoro's planning; the plan served is the one timed, so its figure is not taken again
WHOLE_RUNS = 2


def per_layer_s(run_ms: float, n_targets: int) -> float:
    """Seconds a per-layer profile of a model whose whole run takes ``run_ms`` would take
    on ``n_targets`` targets (see the module docstring)."""
    return run_ms * (RUNS_PER_TARGET * n_targets + REFERENCE_RUNS) / 1e3


def whole_only(run_ms: list[float], n_layers: int | None, n_targets: int,
               budget_s: float) -> str | None:
    """Why a model of ``n_layers`` (None: not cut yet) is planned whole within ``budget_s``
    (None: it is not; ``budget_s`` 0: no budget). ``run_ms``: the reference's runs of the
    calibration inputs; the fastest is the warm figure (the first run of a fresh session
    costs 3-4x)."""
    if budget_s <= 0 or (n_layers is not None and n_layers <= 1) or n_targets <= 1 \
            or not run_ms:
        return None
    need = per_layer_s(min(run_ms), n_targets)
    if need <= PROFILE_SHARE * budget_s:
        return None
    layers = f"{n_layers} layers" if n_layers is not None else "its layers"
    return (f"planned whole: a per-layer profile of {layers} on {n_targets} targets "
            f"would take ~{need:.0f} s at {min(run_ms) / 1e3:.2f} s a run, over half of "
            f"[dispatch] planning_budget_s ({budget_s:g} s); each target the budget had room "
            "for ran the whole model")


def timed_whole(segments: list[tuple[str, int, int]], n_layers: int,
                whole_ms: dict[str, float]) -> tuple[float, list[float], list[float]] | None:
    """A plan made within the budget, timed already: the whole model on one target, whose
    profile timing ran this very executable (held open, :meth:`Measurer.take_spare`) as its
    plan is timed; as :func:`~edgepilot.dispatch.measuring.timing.plan_timing` answers (the
    median for the fastest run: no single run was kept). None: time it."""
    if len(segments) != 1 or segments[0][1:] != (0, n_layers):
        return None
    ms = whole_ms.get(segments[0][0])
    return None if ms is None else (ms, [ms], [ms, ms])


def out_of_budget(ref_ms: list[float], budget_end: float | None) -> str:
    """Why a target's whole model is not run in a budget ending at ``budget_end``
    (``time.monotonic()``; None: no budget): no room is left for a run of it and its timing
    at the reference's pace (``ref_ms``: the reference's runs); "" when there is."""
    if budget_end is None or not ref_ms:
        return ""
    need_s = (1 + WHOLE_RUNS) * min(ref_ms) / 1e3
    if time.monotonic() + need_s <= budget_end:
        return ""
    return (f"not timed: [dispatch] planning_budget_s has no room left for ~{need_s:.0f} s of "
            "its runs (the model planned whole)")
