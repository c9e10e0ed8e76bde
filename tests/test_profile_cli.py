"""``edgepilot profile ...`` as a real subprocess on fake board trees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from board_fixtures import BIN_DIR, FakeBoard, fake_board

__all__ = ["fake_board"]
REPO = Path(__file__).resolve().parents[1]


def cli(fake: FakeBoard, state: Path, *args: str, ok: bool = True,
        tools: bool = True) -> subprocess.CompletedProcess[str]:
    """``edgepilot profile ARGS``; ``tools``: a config naming the emulators in tests/bin
    (they, not edgepilot, read EDGEPILOT_FAKE_ROOT)."""
    env = {**os.environ, "EDGEPILOT_FAKE_ROOT": str(fake.root)}
    config: list[str] = []
    if tools:
        path = state.parent / f"{state.name}-tools.toml"
        path.write_text(f'[dvfs]\nnvpmodel = "{BIN_DIR / "nvpmodel"}"\n'
                        f'jetson_clocks = "{BIN_DIR / "jetson_clocks"}"\n')
        config = ["--config", str(path)]
    proc = subprocess.run([sys.executable, "-m", "edgepilot", *config, "--sysfs-root",
                           str(fake.root), "--state-dir", str(state), "profile", *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert (proc.returncode == 0) == ok, proc.stderr
    return proc


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def test_list_show_apply_status_restore_json(fake_board, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    state = tmp_path / "state"
    before = fake.files()
    names = {p["name"]: p for p in as_json(cli(fake, state, "list", "--json"))}
    assert set(names) == {"performance", "maxn", "balanced", "powersave", "inference"}
    assert names["maxn"]["source"].endswith("jetson-orin.toml") and names["maxn"]["valid"]
    shown = as_json(cli(fake, state, "show", "inference", "--json"))
    gpu = next(t for t in shown["plan"]["targets"] if t["name"] == "17000000.gpu")
    assert gpu["min_hz"] == gpu["max_hz"] == 918000000  # pin = max, no userspace: min = max
    applied = as_json(cli(fake, state, "apply", "balanced", "--json"))
    assert applied["profile"] == "balanced" and applied["nvpmodel"] == 3
    assert fake.read("/var/lib/nvpmodel/status") == "pmode:0003\n"
    status = as_json(cli(fake, state, "status", "--json"))
    assert status["active"] == "balanced" and status["family"] == "jetson-orin"
    assert status["cpu"]["policy0"]["max_khz"] == 1497600  # nvpmodel 25W cap
    assert status["devfreq"]["17000000.gpu"]["governor"] == "nvhost_podgov"
    restored = as_json(cli(fake, state, "restore", "--json"))
    assert restored["restored"] is True and restored["profile"] == "balanced"
    assert fake.files() == before


def test_human_output_and_errors(fake_board, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("rpi5")
    state = tmp_path / "state"
    assert "powersave" in cli(fake, state, "list").stdout
    out = cli(fake, state, "apply", "powersave").stdout
    assert "scaling_max_freq = 1900000" in out
    assert "active profile: powersave" in cli(fake, state, "status").stdout
    # no Jetson tools configured nor installed, and not a Jetson: status does not mention them
    status = cli(fake, state, "status", tools=False).stdout
    assert "active profile: powersave" in status
    assert "nvpmodel" not in status and "jetson_clocks" not in status
    err = cli(fake, state, "apply", "turbo", ok=False).stderr
    assert "unknown profile 'turbo'" in err and "allowed: balanced, performance, powersave" in err
    assert "restored" in cli(fake, state, "restore").stdout
    assert cli(fake, state, "restore").stdout.strip() == "nothing to restore"


@pytest.mark.parametrize("verb", ["show", "apply"])
def test_name_is_required(fake_board, tmp_path: Path, verb: str) -> None:  # type: ignore[no-untyped-def]
    proc = cli(fake_board("rpi5"), tmp_path / "s", verb, ok=False)
    assert "name" in proc.stderr


@pytest.mark.parametrize(("where", "verb", "says"), [
    ("file", "apply", "cannot hold the DVFS lock"),
    ("file", "status", "is not a directory"),
    ("under-file", "apply", "cannot hold the DVFS lock"),
    ("under-file", "restore", "cannot hold the DVFS lock"),
])
def test_an_unusable_state_dir_is_one_line_naming_it(
        fake_board, tmp_path: Path, where: str, verb: str, says: str) -> None:  # type: ignore[no-untyped-def]
    """A state dir that is a file (or lies below one) was a traceback (mkdir of the lock) or
    blamed a 'corrupt journal' and told the operator to restore clocks by hand."""
    fake = fake_board("rpi5")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    state = blocker if where == "file" else blocker / "state"
    before = fake.files()
    proc = cli(fake, state, verb, *(["performance"] if verb == "apply" else []), ok=False,
               tools=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"edgepilot: error: state dir {state} ") and says in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "journal is unreadable" not in proc.stderr
    assert fake.files() == before


def test_a_model_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "models"
    blocker.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "edgepilot", "--state-dir", str(tmp_path / "s"),
                           "--model-dir", str(blocker), "plan", "demo-mlp"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"model dir {blocker} cannot be created" in proc.stderr
