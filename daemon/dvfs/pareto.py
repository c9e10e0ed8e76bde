"""Decisions over per-profile measurements: the Pareto front and the SLO pick.

A *row* is one profile's measurement, as ``edgepilot sweep`` and the daemon's SLO picker make
them: ``{"profile", "ok", "median_ms" (p50), "p95_ms", "power_w", "energy_mj_per_inference"}``.
Rows that failed (``ok`` false) or have no energy (no power sensor) take part in nothing that
needs them. Pure functions: no board, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]
ENERGY = "energy_mj_per_inference"


def _measured(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.get("ok") and r.get(ENERGY) is not None
            and r.get("p95_ms") is not None]


def pareto_front(rows: Sequence[Row], latency: str = "p95_ms") -> list[str]:
    """Profiles no other profile beats on both energy per inference and ``latency``
    (lower is better for both; a tie on both keeps both), ordered by energy."""
    done = _measured(rows)
    front = []
    for r in done:
        e, t = r[ENERGY], r[latency]
        dominated = any(o[ENERGY] <= e and o[latency] <= t and (o[ENERGY] < e or o[latency] < t)
                        for o in done)
        if not dominated:
            front.append(r)
    return [r["profile"] for r in sorted(front, key=lambda r: (r[ENERGY], r[latency]))]


@dataclass(frozen=True)
class SloPick:
    """The profile that meets a latency goal for the fewest joules, or why there is none."""

    profile: str | None
    reason: str | None = None   # set when profile is None

    def as_dict(self) -> dict[str, Any]:
        return {"slo_pick": self.profile, "slo_reason": self.reason}


def slo_pick(rows: Sequence[Row], slo_ms: float, *, exclude: Iterable[str] = (),
             below_power_w: float | None = None) -> SloPick:
    """The lowest-energy profile whose p95 latency is at most ``slo_ms``.

    ``exclude``: profiles not to consider (e.g. one that just ran too hot); ``below_power_w``:
    only profiles that measured less board power than this (cooler ones). Ties on energy go
    to the lower p95, then to the name.
    """
    skip = set(exclude)
    ok = [r for r in rows if r.get("ok") and r["profile"] not in skip]
    if not ok:
        return SloPick(None, "no profile was measured" if not skip
                       else "no other profile was measured")
    if below_power_w is not None:
        ok = [r for r in ok if r.get("power_w") is not None and r["power_w"] < below_power_w]
        if not ok:
            return SloPick(None, f"no other profile measured less power than {below_power_w:.3f} W")
    meeting = [r for r in ok if r.get("p95_ms") is not None and r["p95_ms"] <= slo_ms]
    if not meeting:
        fastest = min((r for r in ok if r.get("p95_ms") is not None),
                      key=lambda r: r["p95_ms"], default=None)
        best = (f"; the fastest, {fastest['profile']}, has p95 {fastest['p95_ms']:.4g} ms"
                if fastest is not None else "")
        return SloPick(None, f"no profile's p95 latency meets {slo_ms:g} ms{best}")
    with_energy = [r for r in meeting if r.get(ENERGY) is not None]
    if not with_energy:
        return SloPick(None, f"{len(meeting)} profile(s) meet {slo_ms:g} ms but the board "
                       "reports no power, so their energy per inference is unknown")
    best_row = min(with_energy, key=lambda r: (r[ENERGY], r["p95_ms"], r["profile"]))
    return SloPick(best_row["profile"])
