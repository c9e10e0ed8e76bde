"""Board layer against fake trees built from the real-board snapshots (tests/boards/*.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from board_fixtures import FakeBoard, any_board, build_tree, fake_board, orin, three_policy_board

from edgepilot.board import Board, report
from edgepilot.errors import BoardError

__all__ = ["any_board", "fake_board", "orin"]  # fixtures imported for pytest

EXPECTED = {
    "orin": {"family": "jetson-orin",
             "policies": {"policy0": [0, 1, 2, 3], "policy4": [4, 5, 6, 7]},
             "devfreq": {"17000000.gpu": "gpu"}},
    "sm8650": {"family": "snapdragon-8gen3",
               "policies": {"policy0": [0, 1], "policy2": [2, 3, 4], "policy5": [5, 6],
                            "policy7": [7]},
               "devfreq": {"3d00000.qcom,kgsl-3d0": "gpu"}},
    "mt6989": {"family": "dimensity-9300",
               "policies": {"policy0": [0, 1, 2, 3], "policy4": [4, 5, 6], "policy7": [7]},
               "devfreq": {"13000000.mali": "gpu"}},
    "rpi5": {"family": "generic", "policies": {"policy0": [0, 1, 2, 3]}, "devfreq": {}},
}


def test_discovery_matches_the_snapshot(any_board: FakeBoard) -> None:
    name = any_board.name  # type: ignore[attr-defined]
    board = Board(any_board.root)
    want = EXPECTED[name]
    assert board.identity.family == want["family"]
    assert {p.name: list(p.cpus) for p in board.policies()} == want["policies"]
    assert {d.name: d.kind for d in board.devfreq()} == want["devfreq"]
    snap = any_board.snapshot
    for pol in board.policies():
        base = f"/sys/devices/system/cpu/cpufreq/{pol.name}"
        table = sorted(int(f) for f in snap[f"{base}/scaling_available_frequencies"].split())
        assert list(pol.frequencies) == table  # ascending even where the kernel prints descending
        assert list(pol.governors) == snap[f"{base}/scaling_available_governors"].split()
        assert pol.max_khz == int(snap[f"{base}/scaling_max_freq"])
        assert pol.online


def test_thermal_zones_by_type_and_unreadable_zones_absent(any_board: FakeBoard) -> None:
    snap = any_board.snapshot
    types = {k.rsplit("/", 2)[1]: v.strip() for k, v in snap.items()
             if k.startswith("/sys/devices/virtual/thermal/") and k.endswith("/type")}
    temps = Board(any_board.root).sample().temps_c
    for zone, kind in types.items():
        temp = snap.get(f"/sys/devices/virtual/thermal/{zone}/temp")
        if temp is None:  # power-gated (EAGAIN FIFO) zones
            assert kind not in temps
        else:
            assert temps[kind] == pytest.approx(int(temp) / 1000)


def test_orin_power_is_vdd_in_from_millivolts_times_milliamps(orin: FakeBoard) -> None:
    s = Board(orin.root).sample()
    # hand-computed from the snapshot: in1 4984 mV x curr1 920 mA ...
    assert s.rails_w == pytest.approx({"VDD_IN": 4.58528, "VDD_CPU_GPU_CV": 0.877184,
                                       "VDD_SOC": 1.435392})
    assert s.power_w == pytest.approx(4.58528)
    assert s.power_source == "ina3221:VDD_IN"
    assert "sum of shunt voltages" not in s.rails_w
    assert {"cv0-thermal", "cv1-thermal", "cv2-thermal"}.isdisjoint(s.temps_c)
    assert s.temps_c["tj-thermal"] == pytest.approx(50.781)


def test_orin_without_vdd_in_sums_rails_and_skips_nc(fake_board) -> None:  # type: ignore[no-untyped-def]
    hw = "/sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"
    fake = fake_board("orin", overrides={f"{hw}/in1_label": "NC\n"})
    s = Board(fake.root).sample()
    assert set(s.rails_w) == {"VDD_CPU_GPU_CV", "VDD_SOC"}
    assert s.power_w == pytest.approx(0.877184 + 1.435392)
    assert s.power_source == "sum"


@pytest.mark.parametrize(("name", "watts"), [("sm8650", 412000 * 4012000 / 1e12),
                                             ("mt6989", 385000 * 3921000 / 1e12)])
def test_phone_battery_power_uA_times_uV(fake_board, name: str, watts: float) -> None:  # type: ignore[no-untyped-def]
    s = Board(fake_board(name).root).sample()
    assert s.power_source == "battery"
    assert s.power_w == pytest.approx(watts)
    # an OEM kernel reporting discharge as positive current gives the same power
    flipped = fake_board(name, overrides={"/sys/class/power_supply/battery/current_now":
                                          s_current(name).lstrip("-")})
    assert Board(flipped.root).sample().power_w == pytest.approx(watts)


@pytest.mark.parametrize("status", ["Charging\n", "Full\n"])
def test_phone_on_a_charger_reports_no_draw(fake_board, status: str) -> None:  # type: ignore[no-untyped-def]
    # the battery current then is what flows in, not what the SoC draws: unknown, not wrong
    s = Board(fake_board("sm8650", overrides={
        "/sys/class/power_supply/battery/status": status}).root).sample()
    assert s.power_w is None


def test_negative_shunt_noise_never_counts_as_negative_power(fake_board) -> None:  # type: ignore[no-untyped-def]
    hw = "/sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"
    fake = fake_board("orin", overrides={f"{hw}/curr3_input": "-4\n", f"{hw}/in1_label": "NC\n"})
    s = Board(fake.root).sample()
    assert s.rails_w["VDD_SOC"] == 0.0
    assert s.power_w is not None and s.power_w >= 0
    assert s.power_w == pytest.approx(0.877184)


def s_current(name: str) -> str:
    from board_fixtures import load_snapshot

    return str(load_snapshot(name)["/sys/class/power_supply/battery/current_now"])


def test_rpi5_has_no_power_sensor(fake_board) -> None:  # type: ignore[no-untyped-def]
    s = Board(fake_board("rpi5").root).sample()
    assert s.power_w is None and s.power_source is None and s.rails_w == {}
    assert s.temps_c == {"cpu-thermal": pytest.approx(44.6)}


def test_rapl_counters_and_power_from_two_samples(tmp_path: Path) -> None:
    snap = three_policy_board()
    zone = "/sys/devices/virtual/powercap/intel-rapl/intel-rapl:0"
    snap[f"{zone}/name"] = "package-0\n"
    snap[f"{zone}/energy_uj"] = "1000000\n"
    snap["_symlinks"]["/sys/class/powercap/intel-rapl:0"] = \
        "../../devices/virtual/powercap/intel-rapl/intel-rapl:0"
    fake = build_tree(tmp_path / "root", snap)
    board = Board(fake.root)
    first = board.sample()
    assert first.energy_j == {"package-0": pytest.approx(1.0)}
    assert first.power_w is None  # no interval yet
    fake.write(f"{zone}/energy_uj", "3000000\n")
    second = board.sample()
    assert second.energy_j["package-0"] == pytest.approx(3.0)
    assert second.power_source == "rapl" and second.power_w is not None and second.power_w > 0


def test_offline_policy_reads_as_unavailable_not_fatal(fake_board) -> None:  # type: ignore[no-untyped-def]
    # Orin in 10W/15W mode: cpu4-7 offline, every policy4 file but related_cpus fails (EBUSY)
    pol = "/sys/devices/system/cpu/cpufreq/policy4"
    busy = [f"{pol}/{n}" for n in ("scaling_governor", "scaling_min_freq", "scaling_max_freq",
                                   "scaling_cur_freq", "scaling_available_frequencies",
                                   "scaling_available_governors", "cpuinfo_max_freq")]
    online = {f"/sys/devices/system/cpu/cpu{c}/online": "0\n" for c in range(4, 8)}
    fake = fake_board("orin", overrides={**online, "/sys/devices/system/cpu/online": "0-3\n"},
                      read_errors=busy)
    s = Board(fake.root).sample()
    assert s.cpu["policy4"] == {"cpus": [4, 5, 6, 7], "governor": None, "cur_khz": None,
                                "min_khz": None, "max_khz": None, "online": False}
    assert s.cpu["policy0"]["online"] is True and s.cpu["policy0"]["max_khz"] == 1984000


def test_board_nobody_wrote_code_for(tmp_path: Path) -> None:
    fake = build_tree(tmp_path / "root", three_policy_board())
    board = Board(fake.root)
    assert board.identity.family == "generic" and board.identity.compatible == ()
    assert [p.name for p in board.policies()] == ["policy0", "policy2", "policy4"]
    assert board.devfreq() == []
    assert Board(tmp_path / "empty").sample().cpu == {}  # an empty root is not an error


def test_real_root_reads_without_error() -> None:
    s = Board("/").sample()  # whatever this machine has; must not raise
    assert isinstance(s.cpu, dict) and isinstance(s.temps_c, dict)


def test_report_is_json_and_names_policies_devices_and_files(orin: FakeBoard) -> None:
    rep = report(orin.root)
    json.dumps(rep)
    assert [p["name"] for p in rep["policies"]] == ["policy0", "policy4"]
    assert [(d["name"], d["kind"]) for d in rep["devfreq"]] == [("17000000.gpu", "gpu")]
    assert "profile_files" not in rep  # profiles are dvfs's: doctor adds them (test_doctor)
    writable = rep["writable"]
    assert writable["/sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq"] is True
    assert "/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu/min_freq" in writable
    assert rep["rails_w"]["VDD_IN"] == pytest.approx(4.58528)
    zones = {z["type"]: z["temp_c"] for z in rep["thermal_zones"]}
    assert zones["cv0-thermal"] is None and zones["tj-thermal"] == pytest.approx(50.781)


def test_writes_are_allow_listed_and_stay_below_the_root(orin: FakeBoard, tmp_path: Path) -> None:
    board = Board(orin.root)
    with pytest.raises(BoardError, match=r"only .* may be written") as exc:
        board.write_value(orin.path("/sys/class/hwmon/hwmon1/curr1_crit"), "1\n")
    assert exc.value.field == "/sys/class/hwmon/hwmon1/curr1_crit"
    outside = tmp_path / "elsewhere" / "scaling_max_freq"
    outside.parent.mkdir()
    outside.write_text("1\n")
    link = orin.path("/sys/devices/system/cpu/cpufreq/policy0/evil")
    link.mkdir()
    (link / "scaling_max_freq").symlink_to(outside)
    with pytest.raises(BoardError, match="outside the sysfs root"):
        board.write_value(link / "scaling_max_freq", "5\n")
    assert outside.read_text() == "1\n"


def test_min_above_max_is_refused_like_the_kernel(orin: FakeBoard) -> None:
    board = Board(orin.root)
    pol = "/sys/devices/system/cpu/cpufreq/policy0"
    before = orin.files()
    with pytest.raises(BoardError, match="EINVAL") as exc:
        board.write_value(orin.path(f"{pol}/scaling_min_freq"), "1984000\n".replace("1984", "1985"))
    assert "1985000" in exc.value.message and f"{pol}/scaling_min_freq" in exc.value.message
    gpu = "/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
    with pytest.raises(BoardError, match="EINVAL"):
        board.write_value(orin.path(f"{gpu}/max_freq"), "204000000\n")
    assert orin.files() == before


@pytest.mark.parametrize("channel", ["1", "2"])
def test_an_unreadable_rail_makes_the_total_unknown_not_a_smaller_sum(
        fake_board, channel: str) -> None:  # type: ignore[no-untyped-def]
    """A labelled INA3221 channel whose current read fails (EAGAIN) for one sample: with
    VDD_IN (channel 1) gone the sum of the sub-rails is not the board's draw, and without
    VDD_IN a sum missing a rail is not either; both are unknown (None), never a dip."""
    hw = "/sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"
    overrides = {} if channel == "1" else {f"{hw}/in1_label": "NC\n"}
    fake = fake_board("orin", overrides=overrides, read_errors=[f"{hw}/curr{channel}_input"])
    s = Board(fake.root).sample()
    assert s.power_w is None and s.power_source is None
    assert s.rails_w  # the rails that did read are still reported


def test_an_ina3221_that_vanishes_mid_sample_makes_the_total_unknown(fake_board) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from edgepilot.board.power import PowerReading, read_ina3221
    from edgepilot.board.sysfs import Sysfs

    fake = fake_board("orin")
    hw = fake.root / "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"
    shutil.rmtree(hw)  # the driver unbound between discovery and the read
    out = PowerReading()
    read_ina3221(Sysfs(fake.root), hw, out)
    assert out.rails_w == {} and out.unreadable == ["hwmon1:*"]
