"""Vendor tools never touch a real board from a fake root: where nvpmodel/jetson_clocks come
from (explicit config, PATH only on '/', skipped otherwise), how a skip is reported, and the
jetson_clocks lock being released when the next profile does not ask for it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from board_fixtures import BIN_DIR, fake_board

from edgepilot.board import Board
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.profiles import ProfileStore
from edgepilot.dvfs.tools import locate_tool
from edgepilot.errors import ProfileError

__all__ = ["fake_board"]
REPO = Path(__file__).resolve().parents[1]
GPU = "/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"


def trap_tools(where: Path) -> Path:
    """A PATH dir whose nvpmodel/jetson_clocks only leave a mark: stand-ins for the real tools
    that would act on the real board."""
    where.mkdir(parents=True, exist_ok=True)
    for name in ("nvpmodel", "jetson_clocks"):
        script = where / name
        script.write_text(f"#!/bin/sh\necho ran >> {where / 'RAN'}\necho 'NV Power Mode: MAXN'"
                          "\necho 0\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return where


def test_fake_root_without_configured_tools_skips_them_and_says_so(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    traps = trap_tools(tmp_path / "trap")
    monkeypatch.setenv("PATH", f"{traps}{os.pathsep}{os.environ['PATH']}")
    before = fake.files()
    mgr = ProfileManager(Board(fake.root), ProfileStore(), tmp_path / "state")
    shown = mgr.show("performance")
    assert shown["tools"]["nvpmodel"]["path"] is None
    assert "[dvfs] nvpmodel is not set" in shown["tools"]["nvpmodel"]["skipped"]
    assert shown["plan"]["nvpmodel"] is None and shown["plan"]["jetson_clocks"] is None
    result = mgr.apply("performance")
    assert not (traps / "RAN").exists()  # nothing from PATH ran
    assert result["nvpmodel"] is None
    assert [s.split(":")[0] for s in result["skipped"]] == ["nvpmodel -m 0", "jetson_clocks"]
    # the sysfs part of the profile still applied
    assert fake.read("/sys/devices/system/cpu/cpufreq/policy0/scaling_governor") == \
        "performance\n"
    assert fake.read("/var/lib/nvpmodel/status") == before["/var/lib/nvpmodel/status"].decode()
    status = mgr.status()
    assert status["tools"]["jetson_clocks"]["skipped"].startswith("sysfs_root is ")
    mgr.restore()
    assert not (traps / "RAN").exists()
    assert fake.files() == before


def test_where_tools_come_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traps = trap_tools(tmp_path / "trap")
    monkeypatch.setenv("PATH", str(traps))
    assert locate_tool("nvpmodel", None, "/").path == traps / "nvpmodel"  # real root: PATH
    assert locate_tool("nvpmodel", None, tmp_path).skip is not None      # fake root: never
    explicit = locate_tool("nvpmodel", BIN_DIR / "nvpmodel", tmp_path)
    assert explicit.path == BIN_DIR / "nvpmodel"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    missing = locate_tool("jetson_clocks", None, "/")
    assert missing.path is None and "not found on PATH" in (missing.error or "")
    not_exec = tmp_path / "nvpmodel.txt"
    not_exec.write_text("not a program")
    bad = locate_tool("nvpmodel", not_exec, "/")
    assert bad.path is None and f"[dvfs] nvpmodel = '{not_exec}'" in (bad.error or "")


def test_a_configured_tool_that_is_not_there_fails_before_any_write(
        fake_board, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    before = fake.files()
    mgr = ProfileManager(Board(fake.root), ProfileStore(), tmp_path / "state",
                         nvpmodel=tmp_path / "no-such-nvpmodel",
                         jetson_clocks=BIN_DIR / "jetson_clocks")
    with pytest.raises(ProfileError) as exc:
        mgr.apply("balanced")
    assert exc.value.field == "nvpmodel"
    assert "profiles.balanced.nvpmodel" in exc.value.message
    assert "[dvfs] nvpmodel" in exc.value.message and "not an executable" in exc.value.message
    assert fake.files() == before
    listed = {p["name"]: p for p in mgr.list()}
    assert listed["balanced"]["valid"] is False and "[dvfs] nvpmodel" in listed["balanced"]["error"]


def test_jetson_clocks_lock_is_released_by_a_profile_that_does_not_want_it(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    monkeypatch.setenv("EDGEPILOT_FAKE_ROOT", str(fake.root))  # the emulators' own input
    before = fake.files()
    mgr = ProfileManager(Board(fake.root), ProfileStore(), tmp_path / "state",
                         nvpmodel=BIN_DIR / "nvpmodel", jetson_clocks=BIN_DIR / "jetson_clocks")
    mgr.apply("performance")
    assert fake.read(f"{GPU}/min_freq") == fake.read(f"{GPU}/max_freq") == "918000000\n"
    mgr.apply("powersave")  # GPU max 50%: refused under a min = max lock, fine once released
    assert fake.read(f"{GPU}/min_freq") == before[f"{GPU}/min_freq"].decode()
    assert fake.read(f"{GPU}/max_freq") == "612000000\n"
    mgr.restore()
    assert fake.files() == before


def test_cli_reports_skipped_tools(fake_board, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    traps = trap_tools(tmp_path / "trap")
    env = {**os.environ, "PATH": f"{traps}{os.pathsep}{os.environ['PATH']}"}
    base = [sys.executable, "-m", "edgepilot", "--sysfs-root", str(fake.root), "--state-dir",
            str(tmp_path / "state"), "profile"]

    def run(*args: str) -> str:
        proc = subprocess.run([*base, *args], capture_output=True, text=True, timeout=120,
                              cwd=REPO, env=env, check=True)
        return proc.stdout

    shown = json.loads(run("show", "performance", "--json"))
    assert any("[dvfs] jetson_clocks is not set" in s for s in shown["plan"]["skipped"])
    assert "skipped nvpmodel -m 0: skipped: sysfs_root is" in run("show", "performance")
    run("apply", "performance")
    human = run("status")
    assert "nvpmodel: skipped: sysfs_root is" in human
    assert "thermal: max 85.0 C on tj-thermal zones, fallback balanced" in human
    run("restore")
    assert not (traps / "RAN").exists()


def test_reload_relocates_the_tools(fake_board, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    from edgepilot.config import parse_config
    from edgepilot.lifecycle import Daemon

    fake = fake_board("orin")
    raw = {"daemon": {"sysfs_root": str(fake.root), "state_dir": str(tmp_path / "state")}}
    old = parse_config(raw)
    new = parse_config({**raw, "dvfs": {"nvpmodel": str(BIN_DIR / "nvpmodel")}})
    daemon = Daemon(old)
    daemon.attach_capabilities({"dvfs"})
    service = daemon.services[0]
    assert daemon.profiles.tools["nvpmodel"].skip is not None
    asyncio.run(service.reload(old, new))  # type: ignore[attr-defined]
    daemon.executor.shutdown()
    assert daemon.profiles.tools["nvpmodel"].path == BIN_DIR / "nvpmodel"
    assert daemon.profiles.summary()["tools"]["jetson_clocks"]["skipped"] is not None

