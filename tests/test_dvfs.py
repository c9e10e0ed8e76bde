"""ProfileManager transactions on fake board trees: apply, restore byte-identical, rollback on
an injected write failure, conflicts, crash journal (SIGKILL), and the daemon service."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from board_fixtures import (
    ALL_BOARDS,
    BIN_DIR,
    FakeBoard,
    build_tree,
    fake_board,
    three_policy_board,
)

from edgepilot.board import Board
from edgepilot.config import parse_config
from edgepilot.dvfs import journal as jr
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.profiles import ProfileStore
from edgepilot.errors import EdgepilotError, ProfileError
from edgepilot.events import EventBus

__all__ = ["fake_board"]
REPO = Path(__file__).resolve().parents[1]


def manager_for(fake: FakeBoard, state: Path, monkeypatch: pytest.MonkeyPatch,
                events: EventBus | None = None) -> ProfileManager:
    """A manager running the nvpmodel/jetson_clocks emulators, by explicit path; the
    emulators (not our code) find the tree through EDGEPILOT_FAKE_ROOT."""
    monkeypatch.setenv("EDGEPILOT_FAKE_ROOT", str(fake.root))
    return ProfileManager(Board(fake.root), ProfileStore(), state, events,
                          nvpmodel=BIN_DIR / "nvpmodel", jetson_clocks=BIN_DIR / "jetson_clocks")


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


PROFILES = ("performance", "balanced", "powersave", "inference")
CASES = [(b, p) for b in ALL_BOARDS for p in PROFILES if (b, p) != ("rpi5", "inference")]


@pytest.mark.parametrize(("board_name", "profile"), CASES)
def test_apply_sets_every_value_and_restore_is_byte_identical(
        fake_board, tmp_path: Path,  # type: ignore[no-untyped-def]
        monkeypatch: pytest.MonkeyPatch, board_name: str, profile: str) -> None:
    fake = fake_board(board_name)
    events = EventBus()
    mgr = manager_for(fake, tmp_path / "state", monkeypatch, events)
    before = fake.files()
    result = mgr.apply(profile)
    assert mgr.active_name == profile
    plan = mgr.show(profile)["plan"]
    for t in plan["targets"]:  # every file holds the profile's value
        unit = "khz" if t["kind"] == "cpu" else "hz"
        names = ("scaling_governor", "scaling_min_freq", "scaling_max_freq") \
            if t["kind"] == "cpu" else ("governor", "min_freq", "max_freq")
        d = next(p for p in [*(f"/sys/devices/system/cpu/cpufreq/{t['name']}",),
                             f"/sys/class/devfreq/{t['name']}"] if fake.path(p).exists())
        for name, want in zip(names, (t["governor"], t[f"min_{unit}"], t[f"max_{unit}"]),
                              strict=True):
            if want is not None:
                assert fake.read(f"{d}/{name}") == f"{want}\n", (d, name)
    assert jr.journal_path(tmp_path / "state").exists()
    assert [e["type"] for e in events.recent()] == ["profile.applied"]
    # a profile equal to the board's state writes nothing; otherwise the writes show in the tree
    changed = differences(before, fake.files())
    assert bool(result["written"]) == bool(changed) or result["nvpmodel"] is not None
    restored = mgr.restore()
    assert restored["restored"] and restored["conflicts"] == []
    assert differences(before, fake.files()) == []
    assert not jr.journal_path(tmp_path / "state").exists()
    assert mgr.active_name is None


def test_orin_power_mode_and_jetson_clocks_are_restored(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    mgr = manager_for(fake, tmp_path / "state", monkeypatch)
    before = fake.files()
    res = mgr.apply("powersave")  # 15W: the emulator offlines cpu4-7 and caps policy0
    assert fake.read("/var/lib/nvpmodel/status") == "pmode:0002\n"
    assert fake.read("/sys/devices/system/cpu/cpu4/online") == "0\n"
    assert fake.read("/sys/devices/system/cpu/cpufreq/policy0/scaling_max_freq") == "1420800\n"
    assert res["skipped"] == ["policy4: offline (CPUs [4, 5, 6, 7])"]
    mgr.apply("performance")  # switch: MAXN + jetson_clocks (min = max everywhere)
    pol0 = "/sys/devices/system/cpu/cpufreq/policy0"
    assert fake.read(f"{pol0}/scaling_min_freq") == fake.read(f"{pol0}/scaling_max_freq") \
        == "1984000\n"
    assert fake.read(f"{pol0}/scaling_governor") == "performance\n"
    assert (tmp_path / "state" / "jetson_clocks.conf").exists()
    mgr.restore()
    assert differences(before, fake.files()) == []


def test_write_failure_half_way_rolls_back_byte_identical(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("sm8650")
    mgr = manager_for(fake, tmp_path / "state", monkeypatch)
    target = "/sys/devices/system/cpu/cpufreq/policy5/scaling_governor"
    before = fake.files()
    fake.make_unwritable(target)  # policy0 and policy2 are written before policy5 fails
    with pytest.raises(ProfileError) as exc:
        mgr.apply("performance")
    fake.close()
    assert f"writing 'performance' to {target} failed" in exc.value.message
    assert "EPERM" in exc.value.message or "EACCES" in exc.value.message
    assert "rolled back" in exc.value.message and exc.value.field == target
    assert differences(before, fake.files()) == []
    assert not jr.journal_path(tmp_path / "state").exists()
    assert mgr.active_name is None


def test_failure_names_the_value_and_keeps_the_previous_profile(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("mt6989")
    mgr = manager_for(fake, tmp_path / "state", monkeypatch)
    original = fake.files()
    mgr.apply("powersave")
    during = fake.files()
    fake.make_unwritable("/sys/devices/system/cpu/cpufreq/policy7/scaling_max_freq")
    with pytest.raises(ProfileError) as exc:
        mgr.apply("performance")
    assert "'3250000'" in exc.value.message  # the value we tried to write
    assert differences(during, fake.files()) == []  # back to powersave, not to the original
    fake.close()
    mgr.restore()
    assert differences(original, fake.files()) == []


def test_restore_leaves_values_somebody_else_changed(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("rpi5")
    events = EventBus()
    mgr = manager_for(fake, tmp_path / "state", monkeypatch, events)
    mgr.apply("powersave")
    pol = "/sys/devices/system/cpu/cpufreq/policy0"
    # 50% of 1.5..2.4 GHz = 1.95 GHz, a tie between table entries that goes down
    assert fake.read(f"{pol}/scaling_max_freq") == "1900000\n"
    fake.write(f"{pol}/scaling_max_freq", "1800000\n")  # a thermal daemon capped it
    result = mgr.restore()
    assert fake.read(f"{pol}/scaling_max_freq") == "1800000\n"
    assert fake.read(f"{pol}/scaling_governor") == "ondemand\n"  # ours: restored
    assert result["conflicts"] == [{"path": f"{pol}/scaling_max_freq", "ours": "1900000",
                                    "now": "1800000", "original": "2400000"}]
    assert [e["type"] for e in events.recent()][-2:] == ["profile.conflict", "profile.restored"]


def test_generic_profiles_on_a_three_policy_cpufreq_only_board(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = build_tree(tmp_path / "root", three_policy_board())
    mgr = manager_for(fake, tmp_path / "state", monkeypatch)
    before = fake.files()
    assert [p["name"] for p in mgr.list()] == ["balanced", "performance", "powersave"]
    mgr.apply("powersave")
    maxes = [fake.read(f"/sys/devices/system/cpu/cpufreq/policy{n}/scaling_max_freq")
             for n in (0, 2, 4)]
    assert maxes == ["800000\n", "1200000\n", "1600000\n"]  # 50%, snapped (ties go down)
    assert fake.read("/sys/devices/system/cpu/cpufreq/policy4/scaling_governor") == \
        "conservative\n"
    mgr.restore()
    assert differences(before, fake.files()) == []


CRASH_SCRIPT = """
import sys, time
from edgepilot.board import Board
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.profiles import ProfileStore
mgr = ProfileManager(Board(sys.argv[1]), ProfileStore(), sys.argv[2])
mgr.apply(sys.argv[3])
print("applied", flush=True)
time.sleep(120)
"""


@pytest.fixture
def killed_after_apply(tmp_path: Path) -> Iterator[tuple[FakeBoard, Path, dict[str, Any]]]:
    fake = build_tree(tmp_path / "root", "sm8650")
    before = fake.files()
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-c", CRASH_SCRIPT, str(fake.root), str(state),
                             "performance"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "applied"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    yield fake, state, before
    fake.close()


def test_sigkill_leaves_a_journal_the_next_service_start_undoes(
        killed_after_apply: tuple[FakeBoard, Path, dict[str, Any]]) -> None:
    from edgepilot.dvfs.service import DvfsService
    from edgepilot.lifecycle import Daemon

    fake, state, before = killed_after_apply
    assert differences(before, fake.files()) != []  # the board is still on "performance"
    left = jr.load(state)
    assert left is not None and left.profile == "performance" and left.applied is not None
    config = parse_config({"daemon": {"sysfs_root": str(fake.root), "state_dir": str(state)},
                           "dvfs": {"profile": "balanced"}})
    daemon = Daemon(config)
    daemon.attach_capabilities({"dvfs"})
    services = daemon.services
    assert isinstance(services[0], DvfsService)

    async def start_stop() -> dict[str, Any]:
        await services[0].start()
        status: dict[str, Any] = daemon.profiles.status()
        await services[0].stop()
        return status

    status = asyncio.run(start_stop())
    daemon.executor.shutdown()
    kinds = [e["type"] for e in daemon.events.recent()]
    assert kinds == ["profile.restored", "profile.applied", "profile.restored"]
    assert daemon.events.recent()[0]["reason"] == "crash-recovery"
    assert status["active"] == "balanced"
    assert differences(before, fake.files()) == []
    assert jr.load(state) is None


def test_a_device_gone_since_the_crash_does_not_keep_the_daemon_down(
        killed_after_apply: tuple[FakeBoard, Path, dict[str, Any]]) -> None:
    """A CPU cluster taken offline after the crash: its journaled values cannot be written, so
    crash recovery is incomplete; the daemon still starts (restoring the rest and applying its
    profile), keeps the journal, and a restore once the cluster is back leaves the board as
    it was."""
    import shutil

    from edgepilot.lifecycle import Daemon

    fake, state, before = killed_after_apply
    policy7 = fake.path("/sys/devices/system/cpu/cpufreq/policy7")
    parked = fake.root.parent / "policy7.offline"
    shutil.move(str(policy7), str(parked))
    config = parse_config({"daemon": {"sysfs_root": str(fake.root), "state_dir": str(state)},
                           "dvfs": {"profile": "balanced"}})
    daemon = Daemon(config)
    daemon.attach_capabilities({"dvfs"})
    services = daemon.services

    async def start_stop() -> dict[str, Any]:
        await services[0].start()
        status: dict[str, Any] = daemon.profiles.status()
        with pytest.raises(ProfileError, match="policy7"):
            await services[0].stop()  # policy7 is still away: the journal stays
        return status

    status = asyncio.run(start_stop())
    daemon.executor.shutdown()
    kinds = [e["type"] for e in daemon.events.recent()]
    assert kinds == ["profile.restore_failed", "profile.applied", "profile.restore_failed"]
    assert status["active"] == "balanced"
    assert jr.load(state) is not None
    shutil.move(str(parked), str(policy7))
    subprocess.run([sys.executable, "-m", "edgepilot", "--sysfs-root", str(fake.root),
                    "--state-dir", str(state), "profile", "restore"],
                   capture_output=True, text=True, timeout=60, cwd=REPO, check=True)
    assert differences(before, fake.files()) == []


def test_crash_journal_restored_by_cli(
        killed_after_apply: tuple[FakeBoard, Path, dict[str, Any]]) -> None:
    fake, state, before = killed_after_apply
    out = subprocess.run([sys.executable, "-m", "edgepilot", "--sysfs-root", str(fake.root),
                          "--state-dir", str(state), "profile", "restore"],
                         capture_output=True, text=True, timeout=60, cwd=REPO, check=True)
    assert "restored (profile performance undone)" in out.stdout
    assert differences(before, fake.files()) == []


def test_journal_is_written_before_the_first_write(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("rpi5")
    mgr = manager_for(fake, tmp_path / "state", monkeypatch)
    seen: list[bool] = []
    real_write = mgr.board.fs.write_text

    def spy(path: Any, text: str) -> None:  # observes, then does the real write
        seen.append(jr.journal_path(tmp_path / "state").exists())
        real_write(path, text)

    mgr.board.fs.write_text = spy  # type: ignore[method-assign]
    mgr.apply("performance")
    assert seen and all(seen)
    journal = jr.load(tmp_path / "state")
    assert journal is not None and journal.original[
        "/sys/devices/system/cpu/cpufreq/policy0/scaling_governor"] == "ondemand\n"
    assert time.time() - journal.started < 3600


@pytest.mark.parametrize("text", [
    '{"sysfs_root": "/", "original": {"/sys/a": "1\\n"',            # truncated by a crash
    '{"sysfs_root": "/", "original": ["scaling_governor"]}',         # wrong shape
    '{"sysfs_root": "/", "original": {}, "format": 0}',              # another version's field
    '[]',
])
def test_a_corrupt_journal_is_a_clear_error_not_a_crash_loop(
        fake_board, tmp_path: Path, text: str) -> None:  # type: ignore[no-untyped-def]
    """The daemon still starts (serving, with /readyz naming the journal) instead of exiting
    at attach, which under Restart=on-failure is a crash loop; the CLI says which file is
    wrong in one line (exit 2, no traceback); nothing on the board or in the journal moves."""
    from edgepilot.lifecycle import Daemon

    fake = fake_board("rpi5")
    state = tmp_path / "state"
    state.mkdir()
    jr.journal_path(state).write_text(text)
    before = fake.files()
    config = parse_config({"daemon": {"sysfs_root": str(fake.root), "state_dir": str(state)},
                           "dvfs": {"profile": "performance"}})
    daemon = Daemon(config)
    daemon.attach_capabilities({"dvfs"})
    services = daemon.services

    async def start_stop() -> str | None:
        await services[0].start()
        reason = daemon.readiness.get("dvfs")
        with pytest.raises(EdgepilotError, match=r"dvfs-journal\.json"):
            await services[0].stop()
        return reason

    reason = asyncio.run(start_stop())
    daemon.executor.shutdown()
    assert reason is not None and "dvfs-journal.json is unreadable" in reason
    assert differences(before, fake.files()) == []
    assert jr.journal_path(state).read_text() == text
    for verb in ("restore", "status"):
        out = subprocess.run([sys.executable, "-m", "edgepilot", "--sysfs-root", str(fake.root),
                              "--state-dir", str(state), "profile", verb],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith("edgepilot: error: the DVFS journal")
        assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1


def test_a_journal_from_another_sysfs_root_is_never_restored_here(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """One state dir, two roots (a dry run on a fake tree, then the real board): restore and
    apply on the second root refused the first root's journal only by luck of paths; now they
    refuse it by name and write nothing, and the first root still restores from it."""
    first, second = fake_board("rpi5"), fake_board("rpi5")
    state = tmp_path / "state"
    before_first, before_second = first.files(), second.files()
    manager_for(first, state, monkeypatch).apply("powersave")
    other = manager_for(second, state, monkeypatch)
    for call in (lambda: other.restore(), lambda: other.apply("performance")):
        with pytest.raises(ProfileError, match="belongs to sysfs root"):
            call()
    assert second.files() == before_second
    manager_for(first, state, monkeypatch).restore()
    assert differences(before_first, first.files()) == []


@pytest.mark.parametrize("board_name", ["orin", "sm8650", "mt6989"])
def test_switching_from_performance_to_powersave_needs_no_restore_first(
        fake_board, tmp_path: Path, board_name: str) -> None:  # type: ignore[no-untyped-def]
    # performance raises the GPU's min to its max; powersave caps max and sets no min: the
    # board's own min from before any profile must make room (it was refused as "max below
    # the current min" before, which also broke thermal fallback chains). No vendor tools
    # here, so no nvpmodel mode change resets the limits in between.
    fake = fake_board(board_name)
    mgr = ProfileManager(Board(fake.root), ProfileStore(), tmp_path / "state", None)
    before = fake.files()
    mgr.apply("performance")
    mgr.apply("powersave")
    assert mgr.active_name == "powersave"
    for t in mgr.show("powersave")["plan"]["targets"]:
        if t["kind"] != "cpu" and t.get("max_hz") is not None:
            d = f"/sys/class/devfreq/{t['name']}"
            lo = int(fake.read(f"{d}/min_freq"))
            assert lo <= int(fake.read(f"{d}/max_freq")) == t["max_hz"]
    mgr.restore()
    assert fake.files() == before
