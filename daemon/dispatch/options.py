"""How one model is planned and watched: the ``[dispatch]`` settings a :class:`ModelDispatch`
(``model_dispatch.py``) takes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class DispatchOptions:
    """One model's planning settings, taken from ``[dispatch]`` (see config_sections.py)."""

    tolerance: float = 0.05
    metric: str = "rel_l2"
    runs: int = 7
    warmup: int = 2
    drift_threshold: float = 0.5
    hysteresis: float = 0.05
    calibration_inputs: int = 2
    max_layers: int = 48
    passes: int = 2
    planning_budget_s: float = 90.0  # see measuring/budget.py (0: none)
    calibration_dir: Path | None = None
    reprobe_s: float = 5.0  # first retry of a target excluded after a fault
