"""What a model's planning can afford: ``[dispatch] planning_budget_s``.

A per-layer profile runs every layer on every target: about :data:`RUNS_PER_TARGET` runs of
the whole model per target (a calibration run for the error, a warm-up, timed runs) and two
more on the reference (its runnable check and its reference pass). A TTS model that takes
4-5 s a run on five targets comes to ~100 s of that alone, and ~270 s of planning with the
whole-model timings, the plan's check and its own timing. When the reference's run says the
per-layer profile alone would take over :data:`PROFILE_SHARE` of the budget, the model is
planned whole: each target runs the whole model, the fastest within tolerance serves, and
the plan's ``merged`` notes say so. A split could only be found by the profile the budget
cannot pay for; a larger budget (or 0: none) plans such a model per layer.
"""

from __future__ import annotations

RUNS_PER_TARGET = 4.0
REFERENCE_RUNS = 2.0
# the rest of the budget: each target's whole model, the plan's check, its timing
PROFILE_SHARE = 0.5


def per_layer_s(run_ms: float, n_targets: int) -> float:
    """Seconds a per-layer profile of a model whose whole run takes ``run_ms`` would take
    on ``n_targets`` targets (see the module docstring)."""
    return run_ms * (RUNS_PER_TARGET * n_targets + REFERENCE_RUNS) / 1e3


def whole_only(run_ms: list[float], n_layers: int, n_targets: int,
               budget_s: float) -> str | None:
    """Why a model of ``n_layers`` is planned whole within ``budget_s`` (None: it is not;
    ``budget_s`` 0: no budget). ``run_ms``: the reference's runs of the calibration inputs;
    the fastest is the warm figure (the first run of a fresh session costs 3-4x)."""
    if budget_s <= 0 or n_layers <= 1 or n_targets <= 1 or not run_ms:
        return None
    need = per_layer_s(min(run_ms), n_targets)
    if need <= PROFILE_SHARE * budget_s:
        return None
    return (f"planned whole: a per-layer profile of {n_layers} layers on {n_targets} targets "
            f"would take ~{need:.0f} s at {min(run_ms) / 1e3:.2f} s a run, over half of "
            f"[dispatch] planning_budget_s ({budget_s:g} s); each target ran the whole model")
