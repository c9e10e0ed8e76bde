"""Thermal warnings raised from telemetry samples: a ``thermal`` event when a zone crosses
``[telemetry] thermal_warn_c``, and another when it cools below the warning minus
``thermal_hysteresis_c`` (so a zone hovering at the limit does not flood the event stream).

Kept apart from the sampler so that it can be merged with the DVFS thermal guard, which watches
the same zones, without touching how samples are read or published.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Emit = Callable[..., Any]


class ThermalWarner:
    """Remembers which zones are hot and emits an event on each change of state."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._hot: set[str] = set()

    def check(self, temps: Mapping[str, float], warn_c: float | None, hysteresis_c: float) -> None:
        """Compare each zone's temperature with the warning threshold (None: no warnings)."""
        if warn_c is None:
            return
        for zone, temp in temps.items():
            if zone not in self._hot and temp >= warn_c:
                self._hot.add(zone)
                self._emit("thermal", zone=zone, temp_c=temp, threshold_c=warn_c, state="hot")
            elif zone in self._hot and temp <= warn_c - hysteresis_c:
                self._hot.discard(zone)
                self._emit("thermal", zone=zone, temp_c=temp, threshold_c=warn_c,
                           state="normal")
