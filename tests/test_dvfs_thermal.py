"""Thermal limits acting: the guard's decisions on a real ProfileManager over a fake Orin tree
(with a hand-driven clock for the dwell), the limits' validation, and end to end: a Daemon with
the DVFS and telemetry services running while the test rewrites the tj zone's ``temp`` file."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from board_fixtures import BIN_DIR, FakeBoard, fake_board

from edgepilot.board import Board
from edgepilot.config import parse_config
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.profiles import ProfileStore
from edgepilot.dvfs.thermal_guard import ThermalGuard
from edgepilot.errors import ProfileError
from edgepilot.events import EventBus

__all__ = ["fake_board"]
POL0 = "/sys/devices/system/cpu/cpufreq/policy0"
GPU = "/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
TJ_TEMP = "/sys/devices/virtual/thermal/thermal_zone8/temp"   # type tj-thermal


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def orin_manager(fake: FakeBoard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 events: EventBus, dirs: list[Path] | None = None) -> ProfileManager:
    monkeypatch.setenv("EDGEPILOT_FAKE_ROOT", str(fake.root))  # read by the emulators only
    return ProfileManager(Board(fake.root), ProfileStore(dirs), tmp_path / "state", events,
                          nvpmodel=BIN_DIR / "nvpmodel", jetson_clocks=BIN_DIR / "jetson_clocks")


def clocks(fake: FakeBoard) -> tuple[str, ...]:
    """(policy0 governor, min, max, GPU governor, nvpmodel status) as the tree holds them."""
    return (fake.read(f"{POL0}/scaling_governor").strip(),
            fake.read(f"{POL0}/scaling_min_freq").strip(),
            fake.read(f"{POL0}/scaling_max_freq").strip(),
            fake.read(f"{GPU}/governor").strip(),
            fake.read("/var/lib/nvpmodel/status").strip())


PERFORMANCE = ("performance", "1984000", "1984000", "performance", "pmode:0000")
BALANCED = ("schedutil", "729600", "1497600", "nvhost_podgov", "pmode:0003")


def moves(events: EventBus) -> list[tuple[str, ...]]:
    out = []
    for e in events.recent():
        if e["type"] == "thermal" and "action" in e:
            out.append(("thermal", e["action"], e["profile"], e.get("fallback", "")))
        elif e["type"] == "profile.applied":
            out.append(("applied", e["profile"], e["reason"]))
    return out


def test_guard_falls_back_returns_after_hysteresis_and_dwell_and_chains(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    before = fake.files()
    events = EventBus()
    mgr = orin_manager(fake, tmp_path, monkeypatch, events)
    clock = Clock()
    guard = ThermalGuard(mgr, events, lambda: 30.0, clock)
    mgr.apply("performance", "config")  # max_c 85 on tj-thermal, fallback balanced
    assert clocks(fake) == PERFORMANCE
    # at max_c is not over it; cpu-thermal is not a listed zone
    assert guard.check({"tj-thermal": 85.0, "cpu-thermal": 99.0}) is None
    ev = guard.check({"tj-thermal": 86.5})
    assert ev is not None and ev["action"] == "fallback" and ev["fallback"] == "balanced"
    assert ev["zone"] == "tj-thermal" and ev["temp_c"] == 86.5 and ev["threshold_c"] == 85.0
    assert mgr.active_name == "balanced" and clocks(fake) == BALANCED
    # cool, but not by the hysteresis (5 C below 85): stay
    clock.t += 100
    assert guard.check({"tj-thermal": 80.5}) is None and mgr.active_name == "balanced"
    # an operator's choice becomes the new base; cool enough but inside the dwell: stay
    clock.t = 2000.0
    mgr.apply("performance")
    assert guard.check({"tj-thermal": 86.0})["action"] == "fallback"  # type: ignore[index]
    clock.t = 2000.0 + 29.0
    assert guard.check({"tj-thermal": 60.0}) is None and mgr.active_name == "balanced"
    clock.t = 2000.0 + 30.0
    ev = guard.check({"tj-thermal": 80.0})
    assert ev is not None and ev["action"] == "return" and ev["profile"] == "performance"
    assert ev["threshold_c"] == 80.0 and ev["state"] == "normal"
    assert mgr.active_name == "performance" and clocks(fake) == PERFORMANCE
    # a chain: balanced has its own limit (90 C) and fallback (powersave); returns step back
    assert guard.check({"tj-thermal": 88.0})["action"] == "fallback"  # type: ignore[index]
    assert guard.check({"tj-thermal": 91.0})["fallback"] == "powersave"  # type: ignore[index]
    assert mgr.active_name == "powersave"
    assert fake.read("/sys/devices/system/cpu/cpu4/online") == "0\n"  # 15W mode
    assert guard.status()["fallbacks"] == ["balanced", "powersave"]
    # powersave has max_c 95 and no fallback: reported once per hot spell, nothing applied
    first = guard.check({"tj-thermal": 96.0})
    assert first is not None and first["action"] == "none"
    assert guard.check({"tj-thermal": 97.0}) is None and mgr.active_name == "powersave"
    clock.t += 30
    assert guard.check({"tj-thermal": 84.0})["profile"] == "balanced"  # type: ignore[index]
    clock.t += 30
    assert guard.check({"tj-thermal": 79.0})["profile"] == "performance"  # type: ignore[index]
    assert clocks(fake) == PERFORMANCE and guard.status()["fallbacks"] == []
    assert [m for m in moves(events) if m[0] == "applied"][-2:] == [
        ("applied", "balanced", "thermal"), ("applied", "performance", "thermal")]
    mgr.restore("stop")
    assert fake.files() == before


def test_guard_follows_restore_and_reports_a_failed_fallback(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    events = EventBus()
    mgr = orin_manager(fake, tmp_path, monkeypatch, events)
    clock = Clock()
    guard = ThermalGuard(mgr, events, lambda: 10.0, clock)
    mgr.apply("performance")
    mgr.restore()
    assert guard.check({"tj-thermal": 99.0}) is None  # nothing active: nothing to enforce
    mgr.apply("performance")
    during = fake.files()
    # balanced's GPU governor write fails at the OS level: the fallback rolls back
    fake.make_unwritable(f"{GPU}/governor")
    ev = guard.check({"tj-thermal": 99.0})
    assert ev is not None and ev["action"] == "fallback_failed" and "rolled back" in ev["message"]
    assert mgr.active_name == "performance"
    assert fake.files() == during
    assert guard.check({"tj-thermal": 99.0}) is None  # no retry storm inside the dwell
    fake.close()  # writable again
    clock.t += 10
    assert guard.check({"tj-thermal": 99.0})["action"] == "fallback"  # type: ignore[index]
    assert mgr.active_name == "balanced"


@pytest.mark.parametrize(("thermal", "field", "needle"), [
    ('max_c = 80.0\nzones = ["nope"]', "thermal.zones", "allowed: cpu-thermal, cv0-thermal"),
    ('max_c = 80.0\nfallback = "ghost"', "thermal.fallback", "unknown profile 'ghost'"),
    ('max_c = 80.0\nfallback = "cold"', "thermal.fallback", "loops: hot -> cold -> hot"),
    ('max_c = 80.0\nfallback = "broken"', "thermal.fallback", "cannot be applied"),
])
def test_limits_that_could_not_act_are_refused_before_any_write(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
        thermal: str, field: str, needle: str) -> None:
    fake = fake_board("orin")
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "jetson-orin.toml").write_text(
        '[profiles.hot.cpu."*"]\ngovernor = "performance"\n'
        f'[profiles.hot.thermal]\n{thermal}\n'
        '[profiles.cold.thermal]\nmax_c = 90.0\nfallback = "hot"\n'
        '[profiles.broken.cpu."*"]\ngovernor = "turbo"\n')
    mgr = orin_manager(fake, tmp_path, monkeypatch, EventBus(), [d])
    before = fake.files()
    with pytest.raises(ProfileError) as exc:
        mgr.apply("hot")
    assert exc.value.field == field and needle in exc.value.message
    assert "profiles.hot.thermal" in exc.value.message or "profiles.cold.thermal" in \
        exc.value.message
    assert fake.files() == before
    assert not next(p for p in mgr.list() if p["name"] == "hot")["valid"]


def test_fallback_without_max_c_names_the_key(tmp_path: Path) -> None:
    from edgepilot.dvfs.profiles import load_file

    path = tmp_path / "x.toml"
    path.write_text('[profiles.a.thermal]\nfallback = "b"\n')
    with pytest.raises(ProfileError) as exc:
        load_file(path)
    assert "profiles.a.thermal" in exc.value.message and "needs 'max_c'" in exc.value.message


async def until(pred: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    """Poll ``pred`` (a bound on waiting, not a measurement)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_daemon_falls_back_when_the_zone_heats_and_returns_when_it_cools(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from edgepilot.lifecycle import Daemon

    fake = fake_board("orin")
    before = fake.files()
    monkeypatch.setenv("EDGEPILOT_FAKE_ROOT", str(fake.root))  # read by the emulators only
    config = parse_config({
        "daemon": {"sysfs_root": str(fake.root), "state_dir": str(tmp_path / "state"),
                   "demo_models": False},
        "dvfs": {"profile": "performance", "nvpmodel": str(BIN_DIR / "nvpmodel"),
                 "jetson_clocks": str(BIN_DIR / "jetson_clocks"), "thermal_dwell_s": 0},
        "telemetry": {"sample_interval_s": 0.1, "publish_interval_s": 3600}})
    daemon = Daemon(config)
    daemon.attach_capabilities({"status", "dvfs", "telemetry"})
    seen: list[tuple[str, ...]] = []

    async def scenario() -> None:
        for svc in daemon.services:
            await svc.start()
        try:
            assert daemon.profiles.active_name == "performance"
            seen.append(clocks(fake))
            await until(lambda: daemon.profiles.status()["thermal"]["watching"], "guard watching")
            fake.write(TJ_TEMP, "88250\n")
            await until(lambda: daemon.profiles.active_name == "balanced", "thermal fallback")
            seen.append(clocks(fake))
            st: dict[str, Any] = await daemon.run_blocking(daemon.profiles.status)
            assert st["thermal"]["base"] == "performance"
            assert st["thermal"]["fallbacks"] == ["balanced"]
            fake.write(TJ_TEMP, "81000\n")  # below 85 but not by 5 C: no return yet
            await until(lambda: daemon.telemetry.latest().get("temps_c", {}).get("tj-thermal")
                        == 81.0, "sampler sees 81 C")
            await asyncio.sleep(0.3)  # a few more samples for the guard to (not) act on
            assert daemon.profiles.active_name == "balanced"
            fake.write(TJ_TEMP, "79500\n")
            await until(lambda: daemon.profiles.active_name == "performance", "return")
            seen.append(clocks(fake))
        finally:
            for svc in reversed(daemon.services):
                await svc.stop()

    asyncio.run(scenario())
    daemon.executor.shutdown()
    assert seen == [PERFORMANCE, BALANCED, PERFORMANCE]
    assert moves(daemon.events) == [
        ("applied", "performance", "config"),
        ("applied", "balanced", "thermal"), ("thermal", "fallback", "performance", "balanced"),
        ("applied", "performance", "thermal"), ("thermal", "return", "performance", "balanced")]
    fallback = next(e for e in daemon.events.recent() if e.get("action") == "fallback")
    assert fallback["zone"] == "tj-thermal" and fallback["temp_c"] == 88.25
    # stop restored everything; the test's own temp edits are put back to compare
    fake.write(TJ_TEMP, before[TJ_TEMP].decode())  # type: ignore[union-attr]
    assert fake.files() == before

