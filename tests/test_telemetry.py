"""Telemetry sampler on real fake-board trees: power, energy, thermal events, seq, metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from board_fixtures import FakeBoard, build_tree
from daemon_fixtures import sampler_on
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edgepilot.board import Board
from edgepilot.config import parse_config
from edgepilot.lifecycle import Daemon
from edgepilot.telemetry import service as telemetry_service
from edgepilot.telemetry.energy import EnergyIntegrator
from edgepilot.telemetry.seq import PersistentSeq

HWMON = "/sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"
ZONE0 = "/sys/devices/virtual/thermal/thermal_zone0/temp"  # cpu-thermal on the Orin


def make_daemon(tmp: Path, root: Path | None, **telemetry: Any) -> Daemon:
    cfg = parse_config({"daemon": {"state_dir": str(tmp / "state"), "demo_models": False},
                        "telemetry": telemetry, "mqtt": {"enabled": False}})
    daemon = Daemon(cfg)
    if root is not None:
        daemon.board = Board(root)
    return daemon


@pytest.fixture
def orin_tree(tmp_path: Path) -> Iterator[FakeBoard]:
    fake = build_tree(tmp_path / "root", "orin")
    yield fake
    fake.close()


def set_rails(fake: FakeBoard, rails: dict[int, tuple[int, int]]) -> None:
    """Channel -> (mV, mA), written the way the INA3221 driver prints them."""
    for ch, (mv, ma) in rails.items():
        fake.write(f"{HWMON}/in{ch}_input", f"{mv}\n")
        fake.write(f"{HWMON}/curr{ch}_input", f"{ma}\n")


# ---- energy --------------------------------------------------------------------------------
def test_trapezoid_matches_hand_integral() -> None:
    e = EnergyIntegrator()
    assert not e.started
    for t, p in [(10.0, 2.0), (10.5, 4.0), (12.0, 4.0), (12.25, 0.0)]:
        e.add(t, p)
    # 0.5*(2+4)/2 + 1.5*4 + 0.25*4/2
    assert e.energy_j == pytest.approx(1.5 + 6.0 + 0.5)
    assert e.gap_s == 0.0


def test_unknown_power_is_not_bridged() -> None:
    e = EnergyIntegrator()
    e.add(0.0, 5.0)
    e.add(1.0, 5.0)
    e.add(2.0, None)   # unreadable: the interval 1..2 and 2..3 are unknown
    e.add(3.0, 7.0)
    e.add(4.0, 7.0)
    assert e.energy_j == pytest.approx(5.0 + 7.0)
    assert e.gap_s == pytest.approx(2.0)
    assert e.add(4.0, 100.0) == 0.0  # time did not advance: nothing added


# ---- seq -----------------------------------------------------------------------------------
def test_seq_survives_clean_restart_and_crash(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.seq"
    a = PersistentSeq(path, block=100)
    got = [a.next() for _ in range(5)]
    assert got == [1, 2, 3, 4, 5]
    a.close()
    b = PersistentSeq(path, block=100)
    assert b.next() == 6  # clean stop: continues right after
    for _ in range(150):
        last = b.next()
    # no close(): a crash. The next run must start above everything handed out.
    c = PersistentSeq(path, block=100)
    assert c.next() > last


def test_seq_recovers_from_a_garbled_file(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.seq"
    path.write_text("not a number\n")
    s = PersistentSeq(path)
    assert s.next() > 10**12  # epoch milliseconds: above any count a daemon reached


# ---- sampler on a fake Orin ----------------------------------------------------------------
def test_power_and_energy_follow_the_rail_files(tmp_path: Path, orin_tree: FakeBoard) -> None:
    daemon = make_daemon(tmp_path, orin_tree.root)
    sampler = sampler_on(daemon, daemon.board)
    # (t, VDD_IN mV, VDD_IN mA, CPU mA): the test's own schedule of rail values
    schedule = [(100.0, 5000, 1000, 200), (100.5, 5000, 1600, 500), (101.5, 4980, 2000, 700),
                (103.0, 5020, 1200, 100), (103.1, 5000, 3000, 900)]
    expected_energy = 0.0
    prev: tuple[float, float] | None = None
    for t, mv, ma, cpu_ma in schedule:
        set_rails(orin_tree, {1: (mv, ma), 2: (4984, cpu_ma)})
        s = sampler.sample_now(now=t)
        p = mv * ma / 1e6
        if prev is not None:
            expected_energy += (prev[1] + p) / 2 * (t - prev[0])
        prev = (t, p)
        assert s["power_w"] == pytest.approx(p)
        assert s["power_source"].endswith("VDD_IN")
        assert s["rails_w"]["VDD_CPU_GPU_CV"] == pytest.approx(4984 * cpu_ma / 1e6)
        assert s["energy_j"] == pytest.approx(expected_energy, rel=1e-6)
        # the CV zones are power-gated (EAGAIN): absent, the others present
        assert "cv0-thermal" not in s["temps_c"]
        assert s["temps_c"]["cpu-thermal"] == pytest.approx(49.687)
        assert "cpu_util_pct" in s and "mem_used_pct" in s
        assert set(s["cpu"]) == {"policy0", "policy4"}
    assert expected_energy > 0


def test_report_energy_per_inference_and_token(tmp_path: Path, orin_tree: FakeBoard) -> None:
    daemon = make_daemon(tmp_path, orin_tree.root)
    sampler = sampler_on(daemon, daemon.board)
    set_rails(orin_tree, {1: (5000, 2000)})            # 10 W
    sampler.sample_now(now=50.0)
    first = sampler.report(now=50.0)                   # opens the window
    set_rails(orin_tree, {1: (5000, 4000)})            # 20 W
    for i in range(4):
        daemon.work.record("llm", 0.1 * (i + 1), tokens=25, now=51.0 + i)
    daemon.work.record("cls", 0.02, now=52.0)
    sampler.sample_now(now=55.0)
    rep = sampler.report(now=55.0)
    window_energy = (10.0 + 20.0) / 2 * 5.0
    assert rep["seq"] == first["seq"] + 1
    assert rep["window_energy_j"] == pytest.approx(window_energy)
    llm = rep["models"]["llm"]
    assert llm["requests"] == 4 and llm["tokens"] == 100
    assert llm["inferences_per_s"] == pytest.approx(4 / 5.0)
    assert llm["tokens_per_s"] == pytest.approx(100 / 5.0)
    # power ramps 10 -> 20 W over the window: P(t) = 10 + 2 (t - 50)
    def energy(a: float, b: float) -> float:
        return 10 * (b - a) + (b - 50) ** 2 - (a - 50) ** 2

    # llm ran [end - latency, end]; the last 20 ms of its [51.8, 52] shared with "cls"
    llm_j = sum(energy(end - lat, end) for end, lat in ((51, .1), (52, .2), (53, .3), (54, .4)))
    llm_j -= energy(51.98, 52.0) / 2
    assert llm["energy_j"] == pytest.approx(llm_j)
    assert llm["energy_per_inference_j"] == pytest.approx(llm_j / 4)
    assert llm["energy_per_token_j"] == pytest.approx(llm_j / 100)
    assert rep["models"]["cls"]["energy_j"] == pytest.approx(energy(51.98, 52.0) / 2)
    assert rep["idle_energy_j"] == pytest.approx(window_energy - llm_j
                                                 - energy(51.98, 52.0) / 2)
    assert llm["latency_p50_ms"] == pytest.approx(250.0)
    assert "energy_per_token_j" not in rep["models"]["cls"]   # no tokens: absent, not zero


def test_board_without_power_sensors_reports_no_power(tmp_path: Path) -> None:
    fake = build_tree(tmp_path / "root", "rpi5")
    try:
        daemon = make_daemon(tmp_path, fake.root)
        sampler = sampler_on(daemon, daemon.board)
        sampler.sample_now(now=1.0)
        daemon.work.record("m", 0.01, now=1.5)
        s = sampler.sample_now(now=2.0)
        rep = sampler.report(now=2.0)
    finally:
        fake.close()
    for key in ("power_w", "energy_j", "rails_w"):
        assert key not in s and key not in rep
    assert "energy_per_inference_j" not in rep["models"]["m"]
    assert s["temps_c"]  # the SoC zone is there
    assert rep["models"]["m"]["requests"] == 1


def test_sampler_without_a_board_still_reports(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path, None)
    sampler = sampler_on(daemon, daemon.board)
    s = sampler.sample_now()
    assert "power_w" not in s and "cpu_util_pct" in s
    assert sampler.report()["seq"] == 1


def test_thermal_events_on_crossing_with_hysteresis(tmp_path: Path, orin_tree: FakeBoard) -> None:
    daemon = make_daemon(tmp_path, orin_tree.root, thermal_warn_c=70.0, thermal_hysteresis_c=5.0)
    events: list[dict[str, Any]] = []
    daemon.events.subscribe(lambda e: events.append(e) if e["type"] == "thermal" else None)
    sampler = sampler_on(daemon, daemon.board)
    for t, milli_c in enumerate([60000, 71000, 74000, 67000, 64000, 72000]):
        orin_tree.write(ZONE0, f"{milli_c}\n")
        sampler.sample_now(now=float(t))
    cpu = [(e["state"], e["temp_c"]) for e in events if e["zone"] == "cpu-thermal"]
    # hot at 71, still hot at 74 and 67 (within hysteresis), normal at 64, hot again at 72
    assert cpu == [("hot", 71.0), ("normal", 64.0), ("hot", 72.0)]
    assert all(e["threshold_c"] == 70.0 for e in events)


def test_listener_failure_does_not_stop_reports(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path, None)
    sampler = sampler_on(daemon, daemon.board)
    got: list[int] = []

    def broken(_: dict[str, Any]) -> None:
        raise ValueError("listener bug")

    sampler.add_listener(broken)
    sampler.add_listener(lambda r: got.append(r["seq"]))
    sampler.add_extra(lambda: {"dropped": 7})
    sampler.sample_now()
    rep = sampler.report()
    assert got == [rep["seq"]] and rep["dropped"] == 7


def test_prometheus_collector_on_the_daemon_registry(tmp_path: Path,
                                                    orin_tree: FakeBoard) -> None:
    daemon = make_daemon(tmp_path, orin_tree.root)
    sampler = telemetry_service.attach(
        daemon.commands, daemon.metrics, config=daemon.current_config, board=daemon.board,
        profiles=None, work=daemon.work, power=daemon.power, events=daemon.events,
        readiness=daemon.readiness, run_blocking=daemon.run_blocking,
        state_dir=daemon.state_dir)
    set_rails(orin_tree, {1: (5000, 3000)})
    sampler.sample_now(now=1.0)
    sampler.sample_now(now=3.0)
    daemon.work.record("m", 0.05, tokens=3)
    text = generate_latest(daemon.metrics).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("edgepilot_power_watts", ())] == pytest.approx(15.0)
    assert samples[("edgepilot_energy_joules_total", ())] == pytest.approx(30.0)
    assert samples[("edgepilot_rail_power_watts", (("rail", "VDD_IN"),))] == pytest.approx(15.0)
    assert samples[("edgepilot_temperature_celsius", (("zone", "cpu-thermal"),))] \
        == pytest.approx(49.687)
    assert samples[("edgepilot_cpufreq_cur_khz", (("domain", "policy4"),))] > 0
    assert samples[("edgepilot_model_requests_total", (("model", "m"),))] == 1
    assert samples[("edgepilot_model_tokens_total", (("model", "m"),))] == 3
