"""Energy per inference with several models: the window's energy is split by the time each model's
requests ran, weighted by the power drawn meanwhile; energy with no request running is idle
energy, attributed to no model. The expected numbers are the test's own integrals.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from board_fixtures import FakeBoard, build_tree
from daemon_fixtures import sampler_on

from edgepilot.board import Board
from edgepilot.config import parse_config
from edgepilot.lifecycle import Daemon
from edgepilot.telemetry.apportion import apportion
from edgepilot.telemetry.work import WorkMeter

HWMON = "/sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"


# ---- the split itself ----------------------------------------------------------------------
def test_constant_power_splits_by_busy_time_and_leaves_idle() -> None:
    got = apportion([(0.0, 10.0), (10.0, 10.0)], {"a": [(1.0, 3.0)], "b": [(5.0, 6.0)]})
    assert got.models_j == pytest.approx({"a": 20.0, "b": 10.0})
    assert got.idle_j == pytest.approx(70.0)
    assert got.total_j == pytest.approx(100.0)


def test_overlapping_requests_share_the_power() -> None:
    got = apportion([(0.0, 10.0), (10.0, 10.0)], {"a": [(1.0, 3.0)], "b": [(2.0, 4.0)]})
    # [2, 3] is shared half and half
    assert got.models_j == pytest.approx({"a": 15.0, "b": 15.0})
    assert got.idle_j == pytest.approx(70.0)
    # two requests of one model against one of another: two shares against one
    got = apportion([(0.0, 3.0), (2.0, 3.0)], {"a": [(0.0, 2.0), (0.0, 2.0)], "b": [(0.0, 2.0)]})
    assert got.models_j == pytest.approx({"a": 4.0, "b": 2.0})
    assert got.idle_j == pytest.approx(0.0)


def test_power_ramp_and_unknown_power_gap() -> None:
    # P = 2t on [0, 4]; unknown on (4, 6); 4 W on [6, 8]
    samples = [(0.0, 0.0), (4.0, 8.0), (5.0, None), (6.0, 4.0), (8.0, 4.0)]
    got = apportion(samples, {"a": [(1.0, 2.0)], "b": [(3.0, 7.0)], "never": []})
    assert got.models_j["a"] == pytest.approx(3.0)            # ∫1..2 2t dt
    assert got.models_j["b"] == pytest.approx(7.0 + 4.0)      # ∫3..4 2t dt + 4 W * [6, 7]
    assert got.models_j["never"] == 0.0
    assert got.idle_j == pytest.approx(1.0 + 5.0 + 4.0)       # [0,1], [2,3], [7,8]
    assert got.total_j == pytest.approx(16.0 + 8.0)           # the gap is not integrated


def test_work_meter_intervals_are_clipped_to_the_window() -> None:
    w = WorkMeter()
    w.record("a", 2.0, now=11.0)   # ran [9, 11]
    w.record("a", 0.5, now=14.0)   # ran [13.5, 14]
    w.record("b", 1.0, now=25.0)   # ran [24, 25]: after the window
    w.record("c", 1.0, ok=False, now=12.0)  # failed: no record, no interval
    assert w.intervals(10.0, 20.0) == {"a": [(10.0, 11.0), (13.5, 14.0)]}
    assert w.window(10.0, now=20.0)["a"].busy_s == pytest.approx(2.5)


# ---- in the sampler, two models on a fake Orin ---------------------------------------------
@pytest.fixture
def orin_tree(tmp_path: Path) -> Iterator[FakeBoard]:
    fake = build_tree(tmp_path / "root", "orin")
    yield fake
    fake.close()


def set_power(fake: FakeBoard, watts: float) -> None:
    """VDD_IN (the Orin's total) at 5 V drawing ``watts``."""
    fake.write(f"{HWMON}/in1_input", "5000\n")
    fake.write(f"{HWMON}/curr1_input", f"{int(watts * 200)}\n")


def test_two_models_each_get_their_share_of_the_window(tmp_path: Path,
                                                       orin_tree: FakeBoard) -> None:
    cfg = parse_config({"daemon": {"state_dir": str(tmp_path / "state"), "demo_models": False},
                        "telemetry": {"publish_interval_s": 60}, "mqtt": {"enabled": False}})
    daemon = Daemon(cfg)
    sampler = sampler_on(daemon, Board(orin_tree.root))
    try:
        set_power(orin_tree, 10.0)
        sampler.sample_now(now=100.0)
        sampler.report(now=100.0)                          # opens the window at 100 s
        for end in (101.0, 102.0, 103.0):                  # "det": 3 x 0.5 s at 10 W
            daemon.work.record("det", 0.5, now=end)
        sampler.sample_now(now=105.0)                      # still 10 W
        set_power(orin_tree, 30.0)                         # ramps 10 -> 30 W over [105, 110]
        daemon.work.record("llm", 3.0, tokens=30, now=109.0)  # ran [106, 109]
        sampler.sample_now(now=110.0)
        rep = sampler.report(now=110.0)

        window = 10.0 * 5 + (10.0 + 30.0) / 2 * 5         # 150 J
        det = 3 * 0.5 * 10.0                               # 15 J
        # P(t) = 10 + 4 (t - 105) on [105, 110]: ∫106..109 = 30 + 4 * (16 - 1) / 2
        llm = 30.0 + 30.0
        assert rep["window_energy_j"] == pytest.approx(window)
        assert rep["models"]["det"]["energy_j"] == pytest.approx(det)
        assert rep["models"]["det"]["energy_per_inference_j"] == pytest.approx(det / 3)
        assert rep["models"]["det"]["busy_s"] == pytest.approx(1.5)
        assert "energy_per_token_j" not in rep["models"]["det"]
        assert rep["models"]["llm"]["energy_j"] == pytest.approx(llm)
        assert rep["models"]["llm"]["energy_per_inference_j"] == pytest.approx(llm)
        assert rep["models"]["llm"]["energy_per_token_j"] == pytest.approx(llm / 30)
        assert rep["idle_energy_j"] == pytest.approx(window - det - llm)
        # nothing is counted twice: the shares and the idle energy make the window's energy
        shares = sum(m["energy_j"] for m in rep["models"].values())
        assert shares + rep["idle_energy_j"] == pytest.approx(rep["window_energy_j"])

        # the next window: only "det" works, over [110, 112] at 30 W
        daemon.work.record("det", 1.0, now=111.5)          # ran [110.5, 111.5]
        sampler.sample_now(now=112.0)
        nxt = sampler.report(now=112.0)
        assert nxt["window_energy_j"] == pytest.approx(60.0)
        assert nxt["models"]["det"]["energy_j"] == pytest.approx(30.0)
        assert "energy_j" not in nxt["models"]["llm"]      # idle this window: no share
        assert "energy_per_inference_j" not in nxt["models"]["llm"]
        assert nxt["idle_energy_j"] == pytest.approx(30.0)
    finally:
        sampler.seq.close()
        daemon.executor.shutdown(wait=False)


def test_without_a_power_sensor_no_energy_fields(tmp_path: Path) -> None:
    cfg = parse_config({"daemon": {"state_dir": str(tmp_path / "state"), "demo_models": False},
                        "mqtt": {"enabled": False}})
    daemon = Daemon(cfg)  # no board at all
    sampler = sampler_on(daemon, None)
    try:
        sampler.sample_now(now=1.0)
        daemon.work.record("m", 0.2, now=1.5)
        sampler.sample_now(now=2.0)
        rep = sampler.report(now=2.0)
        assert "idle_energy_j" not in rep and "window_energy_j" not in rep
        assert rep["models"]["m"]["busy_s"] == pytest.approx(0.2)
        assert "energy_j" not in rep["models"]["m"]
        assert "energy_per_inference_j" not in rep["models"]["m"]
    finally:
        sampler.seq.close()
        daemon.executor.shutdown(wait=False)
