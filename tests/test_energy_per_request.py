"""Energy per request: the board's power over a request's wall time, shared with the requests
busy at the same moments (finished or still in flight), held at the last sample's value past
it, null without a power sensor. The expected numbers are the test's own integrals.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from board_fixtures import FakeBoard, build_tree, three_policy_board
from daemon_fixtures import sampler_on

from edgepilot.board import Board
from edgepilot.config import parse_config
from edgepilot.lifecycle import Daemon
from edgepilot.telemetry.metrics import TelemetryCollector
from edgepilot.telemetry.sampler import TelemetrySampler, power_points

HWMON = "/sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"


def set_power(fake: FakeBoard, watts: float) -> None:
    """VDD_IN (the Orin's total) at 5 V drawing ``watts``."""
    fake.write(f"{HWMON}/in1_input", "5000\n")
    fake.write(f"{HWMON}/curr1_input", f"{int(watts * 200)}\n")


@pytest.fixture
def sampler(tmp_path: Path) -> Iterator[tuple[TelemetrySampler, FakeBoard]]:
    fake = build_tree(tmp_path / "root", "orin")
    cfg = parse_config({"daemon": {"state_dir": str(tmp_path / "state"), "demo_models": False},
                        "telemetry": {"publish_interval_s": 60}, "mqtt": {"enabled": False}})
    daemon = Daemon(cfg)
    s = sampler_on(daemon, Board(fake.root))
    try:
        yield s, fake
    finally:
        s.seq.close()
        daemon.executor.shutdown(wait=False)
        fake.close()


# ---- the power curve over one request ------------------------------------------------------
def test_power_points_interpolate_hold_and_know_when_unknown() -> None:
    samples = [(0.0, 10.0), (10.0, 20.0)]
    assert power_points(samples, 2.0, 4.0) == [(2.0, 12.0), (4.0, 14.0)]
    # a sample inside the request is kept; past the last sample the power is held
    assert power_points(samples, 8.0, 12.0) == [(8.0, 18.0), (10.0, 20.0), (12.0, 20.0)]
    # before the first sample kept, and next to an unreadable one, power is unknown
    assert power_points(samples, -2.0, -1.0) is None
    assert power_points([(0.0, 10.0), (1.0, None)], 1.5, 2.0) is None
    assert power_points([], 0.0, 1.0) is None


# ---- WorkMeter.begin/end with the sampler as attributor ------------------------------------
def test_one_request_gets_the_power_over_its_wall_time(sampler) -> None:  # type: ignore[no-untyped-def]
    s, fake = sampler
    w = s.work
    set_power(fake, 10.0)
    s.sample_now(now=100.0)
    set_power(fake, 20.0)
    s.sample_now(now=110.0)                     # P(t) = 10 + (t - 100) on [100, 110]
    req = w.begin("det", now=102.0)
    got = w.end(req, now=104.0)
    assert got == pytest.approx((12.0 + 14.0) / 2 * 2.0)  # 26 J
    # past the last sample the power is held at its 20 W
    req = w.begin("det", now=111.0)
    assert w.end(req, now=111.5) == pytest.approx(10.0)
    assert w.window(60.0, now=112.0)["det"].energy_total_j == pytest.approx(36.0)
    assert s.snapshot()["models"]["det"]["energy_total_j"] == pytest.approx(36.0)


def test_concurrent_requests_share_and_add_up_to_the_board_energy(sampler) -> None:  # type: ignore[no-untyped-def]
    s, fake = sampler
    w = s.work
    set_power(fake, 10.0)
    s.sample_now(now=0.0)
    s.sample_now(now=10.0)
    a = w.begin("a", now=1.0)
    b = w.begin("b", now=2.0)
    # "a" ends first while "b" is still in flight: [2, 3] is shared half and half
    ea = w.end(a, now=3.0)
    eb = w.end(b, now=4.0)
    assert ea == pytest.approx(10.0 + 5.0)
    assert eb == pytest.approx(5.0 + 10.0)
    # nothing counted twice: the board drew 30 J over [1, 4]
    assert ea + eb == pytest.approx(30.0)
    # two requests of one model count as two shares
    c1, c2 = w.begin("c", now=5.0), w.begin("c", now=5.0)
    assert w.end(c1, now=6.0) == pytest.approx(5.0)
    assert w.end(c2, now=6.0) == pytest.approx(5.0)


def test_in_flight_requests_take_their_share_of_the_window(sampler) -> None:  # type: ignore[no-untyped-def]
    s, fake = sampler
    w = s.work
    set_power(fake, 10.0)
    s.sample_now(now=100.0)
    s.report(now=100.0)
    req = w.begin("llm", now=104.0)             # a long generation, still running
    s.sample_now(now=110.0)
    rep = s.report(now=110.0)
    # the board's power while it ran is not idle energy even though it has not finished
    assert rep["idle_energy_j"] == pytest.approx(40.0)
    assert w.oldest_in_flight() == 104.0
    w.end(req, tokens=5, now=112.0)
    assert w.oldest_in_flight() is None


def test_failed_and_repeated_ends_attribute_nothing(sampler) -> None:  # type: ignore[no-untyped-def]
    s, fake = sampler
    w = s.work
    set_power(fake, 10.0)
    s.sample_now(now=0.0)
    req = w.begin("m", now=1.0)
    assert w.end(req, ok=False, now=2.0) is None
    assert w.end(req, now=3.0) is None          # already ended: not recorded twice
    stats = w.window(60.0, now=3.0)["m"]
    assert stats.errors_total == 1 and stats.requests_total == 0
    assert stats.energy_total_j is None
    assert w.oldest_in_flight() is None


def test_prometheus_counter_is_the_sum_of_the_answers(sampler) -> None:  # type: ignore[no-untyped-def]
    s, fake = sampler
    w = s.work
    set_power(fake, 8.0)
    s.sample_now(now=0.0)
    answers = [w.end(w.begin("det", now=t), now=t + 0.25) for t in (1.0, 2.0, 3.0)]
    assert all(e is not None and e > 0 for e in answers)
    fams = {m.name: m for m in TelemetryCollector(s).collect()}
    fam = fams["edgepilot_model_energy_joules"]
    assert fam.type == "counter"
    sample = next(x for x in fam.samples if x.labels == {"model": "det"})
    assert sample.name == "edgepilot_model_energy_joules_total"
    assert sample.value == pytest.approx(sum(e for e in answers if e is not None), abs=1e-6)
    assert sample.value == pytest.approx(3 * 0.25 * 8.0, abs=1e-6)


def test_without_a_power_sensor_the_energy_is_null(tmp_path: Path) -> None:
    fake = build_tree(tmp_path / "root", three_policy_board())  # cpufreq only: no rails
    cfg = parse_config({"daemon": {"state_dir": str(tmp_path / "state"), "demo_models": False},
                        "mqtt": {"enabled": False}})
    daemon = Daemon(cfg)
    s = sampler_on(daemon, Board(fake.root))
    try:
        s.sample_now(now=0.0)
        s.sample_now(now=1.0)
        req = daemon.work.begin("m", now=0.2)
        assert daemon.work.end(req, now=0.4) is None   # unknown, not 0
        m = s.snapshot()["models"]["m"]
        assert "energy_total_j" not in m and m["requests_total"] == 1
        fams = {f.name: f for f in TelemetryCollector(s).collect()}
        assert fams["edgepilot_model_energy_joules"].samples == []
    finally:
        s.seq.close()
        daemon.executor.shutdown(wait=False)
        fake.close()


def test_trip_points_are_read_per_zone(tmp_path: Path) -> None:
    zone = "/sys/devices/virtual/thermal/thermal_zone0"
    fake = build_tree(tmp_path / "root", "orin", overrides={
        f"{zone}/trip_point_0_temp": "105000\n", f"{zone}/trip_point_0_type": "critical\n",
        f"{zone}/trip_point_1_temp": "99000\n", f"{zone}/trip_point_1_type": "passive\n"})
    try:
        trips = Board(fake.root).thermal_trips()
        assert trips == {"cpu-thermal": [{"type": "passive", "temp_c": 99.0},
                                         {"type": "critical", "temp_c": 105.0}]}
    finally:
        fake.close()
