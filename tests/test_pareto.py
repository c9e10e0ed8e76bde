"""The decisions over per-profile measurements: Pareto front and SLO pick (pure functions)."""

from __future__ import annotations

from typing import Any

from edgepilot.dvfs.pareto import pareto_front, slo_pick


def row(name: str, p50: float, p95: float, watts: float | None, ok: bool = True
        ) -> dict[str, Any]:
    return {"profile": name, "ok": ok, "median_ms": p50, "p95_ms": p95, "power_w": watts,
            "energy_mj_per_inference": None if watts is None else watts * p50}


ROWS = [
    row("performance", 2.0, 2.5, 10.0),   # 20 mJ, fastest
    row("balanced", 3.0, 3.4, 5.0),       # 15 mJ
    row("maxn", 3.0, 3.9, 6.0),           # 18 mJ: balanced beats it on both
    row("powersave", 6.0, 7.0, 2.0),      # 12 mJ, slowest
    row("broken", 1.0, 1.0, 1.0, ok=False),
]


def test_pareto_front_keeps_the_undominated_ordered_by_energy() -> None:
    assert pareto_front(ROWS) == ["powersave", "balanced", "performance"]
    # on p50 maxn ties balanced on latency and loses on energy: still dominated
    assert "maxn" not in pareto_front(ROWS, latency="median_ms")
    # two identical measurements dominate neither
    twins = [row("a", 1, 1, 1), row("b", 1, 1, 1)]
    assert pareto_front(twins) == ["a", "b"]


def test_slo_pick_is_the_lowest_energy_profile_that_meets_p95() -> None:
    assert slo_pick(ROWS, 100).profile == "powersave"
    assert slo_pick(ROWS, 7.0).profile == "powersave"          # p95 == SLO meets it
    assert slo_pick(ROWS, 6.99).profile == "balanced"
    assert slo_pick(ROWS, 3.0).profile == "performance"
    none = slo_pick(ROWS, 2.4)
    assert none.profile is None
    assert none.reason == ("no profile's p95 latency meets 2.4 ms; the fastest, performance, "
                           "has p95 2.5 ms")
    assert none.as_dict() == {"slo_pick": None, "slo_reason": none.reason}


def test_slo_re_pick_excludes_the_hot_profile_and_anything_not_cooler() -> None:
    # balanced ran hot at 5 W: only profiles below 5 W are cooler, and powersave misses 5 ms
    pick = slo_pick(ROWS, 5.0, exclude={"balanced"}, below_power_w=5.0)
    assert pick.profile is None and "meets 5 ms" in (pick.reason or "")
    assert slo_pick(ROWS, 8.0, exclude={"balanced"}, below_power_w=5.0).profile == "powersave"
    nothing = slo_pick(ROWS, 8.0, exclude={"powersave"}, below_power_w=2.0)
    assert nothing.profile is None
    assert nothing.reason == "no other profile measured less power than 2.000 W"


def test_without_a_power_sensor_nothing_is_picked_and_it_says_why() -> None:
    rows = [row("a", 1, 1, None), row("b", 2, 2, None)]
    pick = slo_pick(rows, 10)
    assert pick.profile is None
    assert pick.reason == ("2 profile(s) meet 10 ms but the board reports no power, so their "
                           "energy per inference is unknown")
    assert pareto_front(rows) == []
