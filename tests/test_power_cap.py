"""`[dvfs] power_cap_w` on a reactive fake Orin: the loop's steps on a real ProfileManager (each
sample handed over by the test), caps under profiles, crash recovery, and end to end: a daemon
whose board draws more than the cap steps its clocks down until the board is under it, reports
every step on MQTT and in telemetry, and leaves the tree byte-identical on stop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from board_fixtures import BIN_DIR, FakeBoard, build_tree, fake_board
from daemon_proc import DaemonProcess
from mqtt_fixtures import Broker, Recorder, broker, wait_for
from reactive_board import BoardModel, ReactiveBoard

from edgepilot.board import Board
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.powercap import RAISE_AFTER, PowerCap
from edgepilot.dvfs.profiles import ProfileStore
from edgepilot.events import EventBus

__all__ = ["broker", "fake_board"]
POL = "/sys/devices/system/cpu/cpufreq/policy{}"
GPU = "/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
CPU_TABLE = [115200, 192000, 268800, 345600, 422400, 499200, 576000, 652800, 729600, 806400,
             883200, 960000, 1036800, 1113600, 1190400, 1267200, 1344000, 1420800, 1497600,
             1574400, 1651200, 1728000, 1804800, 1881600, 1958400, 1984000]
GPU_TABLE = [306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000]


def max_files(fake: FakeBoard) -> dict[str, int]:
    def khz(path: str) -> int:
        text = fake.read(path).strip()
        # read between the daemon's truncate and its write: not capped yet, ask again
        return int(text) if text else 1 << 62

    return {"policy0": khz(f"{POL.format(0)}/scaling_max_freq"),
            "policy4": khz(f"{POL.format(4)}/scaling_max_freq"),
            "17000000.gpu": khz(f"{GPU}/max_freq")}


def steps(events: EventBus, direction: str | None = None) -> list[dict[str, Any]]:
    return [e for e in events.recent() if e["type"] == "power_cap.step"
            and (direction is None or e["direction"] == direction)]


def test_steps_down_one_table_step_until_under_the_cap_then_back_up_with_hysteresis(
        fake_board, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    before = fake.files()
    board = ReactiveBoard(fake.root, BoardModel(util_cpu=1.0, util_gpu=1.0))
    events = EventBus(history=1000)
    mgr = ProfileManager(Board(fake.root), ProfileStore(), tmp_path / "state", events)
    cap = PowerCap(mgr, events, lambda: 9.0, lambda: 0.5)

    def tick() -> float:
        board.update()
        watts = board.power_w()
        cap.check(watts)
        return watts

    start = board.power_w()
    assert start > 17.0  # everything at max under full load
    wait_for(lambda: tick() <= 9.0 and board.update() and board.power_w() <= 9.0,
             timeout=60, interval=0, what="power under the cap")
    down = steps(events, "down")
    assert down and not steps(events, "up")
    tables = {"policy0": CPU_TABLE, "policy4": CPU_TABLE, "17000000.gpu": GPU_TABLE}
    for e in down:  # one table step below where it ran (under full load: its max)
        table = tables[e["device"]]
        assert table.index(e["to"]) == table.index(e["from"]) - 1, e
        assert e["power_w"] > e["cap_w"] == 9.0
    # the cap spread over the biggest consumers: every device went down
    assert {e["device"] for e in down} == set(tables)
    assert max_files(fake) == {d: min(e["to"] for e in down if e["device"] == d)
                               for d in tables}
    status = cap.status()
    assert status["state"] == "capping" and len(status["steps"]) == len(down)
    assert set(mgr.status()["caps"]) == set(tables)
    # steady load, just under the cap: nothing moves (an undo would go over: no flapping)
    for _ in range(4 * RAISE_AFTER):
        tick()
    assert len(steps(events)) == len(down)
    # the load drops: the steps are undone, last first, each after RAISE_AFTER quiet samples
    board.set(util_cpu=0.2, util_gpu=0.2)
    wait_for(lambda: tick() is not None and not cap.steps, timeout=60, interval=0,
             what="every step undone")
    up = steps(events, "up")
    assert [(e["device"], e["from"], e["to"]) for e in up] == \
        [(e["device"], e["to"], e["from"]) for e in reversed(down)]
    assert max_files(fake) == {"policy0": 1984000, "policy4": 1984000,
                               "17000000.gpu": 918000000}
    assert cap.status()["state"] == "under" and mgr.status()["caps"] == {}
    mgr.restore("stop")
    board.close()
    assert fake.files() == before


def test_a_cap_under_the_static_draw_takes_every_clock_to_its_floor_and_says_so_once(
        fake_board, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    before = fake.files()
    board = ReactiveBoard(fake.root, BoardModel())
    events = EventBus(history=1000)
    mgr = ProfileManager(Board(fake.root), ProfileStore(), tmp_path / "state", events)
    cap = PowerCap(mgr, events, lambda: 1.0, lambda: 0.5)  # static draw alone is ~3.3 W
    for _ in range(len(CPU_TABLE) * 2 + len(GPU_TABLE) + 5):
        board.update()
        cap.check(board.power_w())
    saturated = [e for e in events.recent() if e["type"] == "power_cap.saturated"]
    assert len(saturated) == 1 and saturated[0]["cap_w"] == 1.0
    assert max_files(fake) == {"policy0": CPU_TABLE[0], "policy4": CPU_TABLE[0],
                               "17000000.gpu": GPU_TABLE[0]}
    # the mins came down with the maxes where they had to (the kernel's min <= max)
    assert int(fake.read(f"{POL.format(0)}/scaling_min_freq")) <= CPU_TABLE[0]
    assert cap.status()["state"] == "saturated"
    mgr.restore("stop")
    board.close()
    assert fake.files() == before


def test_a_profile_applied_under_a_cap_stays_under_it_and_lifting_gives_its_clocks_back(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    before = fake.files()
    monkeypatch.setenv("EDGEPILOT_FAKE_ROOT", str(fake.root))  # read by the emulators only
    mgr = ProfileManager(Board(fake.root), ProfileStore(), tmp_path / "state",
                         nvpmodel=BIN_DIR / "nvpmodel", jetson_clocks=BIN_DIR / "jetson_clocks")
    gpu = fake.path(GPU)
    mgr.set_cap(gpu, 612000000)
    assert (fake.read(f"{GPU}/min_freq"), fake.read(f"{GPU}/max_freq")) == \
        ("306000000\n", "612000000\n")
    # performance pins the GPU at its top (min = max = 918 MHz): under the cap, a pin at 612
    mgr.apply("performance")
    assert (fake.read(f"{GPU}/min_freq"), fake.read(f"{GPU}/max_freq")) == \
        ("612000000\n", "612000000\n")
    assert fake.read(f"{POL.format(0)}/scaling_min_freq") == "1984000\n"  # not capped
    # lifting the cap gives the profile's own limits back, in an order the kernel accepts
    mgr.set_cap(gpu, None)
    assert (fake.read(f"{GPU}/min_freq"), fake.read(f"{GPU}/max_freq")) == \
        ("918000000\n", "918000000\n")
    # a cap, then a profile switch: powersave's GPU max (50%: 612 MHz) is under a 714 cap
    mgr.set_cap(gpu, 714000000)
    mgr.apply("powersave")
    assert fake.read(f"{GPU}/max_freq") == "612000000\n"
    assert mgr.status()["caps"]["17000000.gpu"]["uncapped_max"] == 612000000
    mgr.restore("stop")
    assert mgr.status()["caps"] == {}
    assert fake.files() == before


def test_a_crash_while_capped_is_undone_by_the_next_start(fake_board, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    before = fake.files()
    mgr = ProfileManager(Board(fake.root), ProfileStore(), tmp_path / "state")
    mgr.set_cap(fake.path(POL.format(4)), 1190400)
    mgr.set_cap(fake.path(GPU), 510000000)
    assert fake.files() != before
    # the process dies here; the next one finds the journal and puts the board back
    again = ProfileManager(Board(fake.root), ProfileStore(), tmp_path / "state")
    assert again.recover() is not None
    assert fake.files() == before


CAP_W = 9.0


def daemon_config(brk: Broker, root: Path) -> str:
    return f"""
[daemon]
demo_models = false
sysfs_root = "{root}"
[dvfs]
power_cap_w = {CAP_W}
power_cap_hysteresis_w = 0.5
[telemetry]
sample_interval_s = 0.1
publish_interval_s = 0.5
[mqtt]
host = "{brk.host}"
port = {brk.port}
device_id = "cap"
"""


def test_a_daemon_killed_while_capping_leaves_a_journal_the_cli_restores(
        tmp_path: Path, broker: Broker) -> None:
    fake = build_tree(tmp_path / "root", "orin")
    before = fake.files()
    board = ReactiveBoard(fake.root, BoardModel()).start()
    work = tmp_path / "d"
    work.mkdir()
    d = DaemonProcess(work, daemon_config(broker, fake.root))
    try:
        d.start()
        wait_for(lambda: max_files(fake)["17000000.gpu"] < 918000000
                 and max_files(fake)["policy0"] < 1984000, timeout=120, what="caps written")
        d.stop(signal.SIGKILL)
        assert fake.files() != before
        restore = subprocess.run(
            [sys.executable, "-m", "edgepilot", "--sysfs-root", str(fake.root), "--state-dir",
             str(d.state_dir), "profile", "restore", "--json"],
            capture_output=True, text=True, timeout=120)
        assert restore.returncode == 0, restore.stderr
        assert json.loads(restore.stdout)["restored"] is True
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        board.close()
        fake.close()
    assert fake.files() == before


def test_daemon_steps_clocks_down_under_the_cap_reports_each_step_and_restores_on_stop(
        tmp_path: Path, broker: Broker) -> None:
    fake = build_tree(tmp_path / "root", "orin")
    before = fake.files()
    board = ReactiveBoard(fake.root, BoardModel(util_cpu=1.0, util_gpu=1.0)).start()
    rec = Recorder(broker, ["edgepilot/cap/events", "edgepilot/cap/telemetry"])
    work = tmp_path / "d"
    work.mkdir()
    d = DaemonProcess(work, daemon_config(broker, fake.root))
    try:
        assert board.power_w() > 1.8 * CAP_W
        d.start()
        wait_for(lambda: board.power_w() <= CAP_W, timeout=120, what="board under the cap")
        events = wait_for(lambda: [e for e in rec.json_on("edgepilot/cap/events")
                                   if e["type"] == "power_cap.step"], what="step events")
        assert all(e["direction"] == "down" and e["cap_w"] == CAP_W for e in events)
        assert {e["device"] for e in events} <= {"policy0", "policy4", "17000000.gpu"}
        now = max_files(fake)
        assert now["policy0"] < 1984000 and now["17000000.gpu"] < 918000000
        code, tele = d.request("GET", "/v1/telemetry")
        assert code == 200 and tele["power_cap"]["cap_w"] == CAP_W
        assert tele["power_cap"]["state"] in ("capping", "under")
        assert tele["power_cap"]["caps"]["17000000.gpu"]["cap"] == now["17000000.gpu"]
        wait_for(lambda: any(m.get("power_cap", {}).get("steps")
                             for m in rec.json_on("edgepilot/cap/telemetry")),
                 what="MQTT telemetry carrying the cap's steps")
        code, prof = d.request("GET", "/v1/profile")
        assert code == 200 and prof["power_cap"]["cap_w"] == CAP_W
        assert set(prof["caps"]) == {e["device"] for e in events}
        code, status = d.request("POST", "/v1/commands/status", {})
        assert code == 200 and json.dumps(status).count('"power_cap"') >= 1
        assert d.stop() == 0
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        rec.close()
        board.close()
        fake.close()
    assert fake.files() == before
