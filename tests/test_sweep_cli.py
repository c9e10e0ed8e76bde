"""`edgepilot sweep`: the plan under every profile, power and energy, the board put back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from board_fixtures import build_tree

from edgepilot.formats.onnx_gen import mlp_stack

# the Orin snapshot's VDD_IN: 4984 mV x 920 mA
ORIN_VDD_IN_W = 4.984 * 0.920


def run_sweep(tmp_path: Path, root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    mlp_stack(models / "m.onnx", widths=(32, 64, 32))
    cfg = tmp_path / "c.toml"
    cfg.write_text("[mqtt]\nenabled = false\n[dispatch]\nkernel_corpus = false\n"
                   "profile_runs = 3\n")
    return subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--sysfs-root", str(root),
         "--state-dir", str(tmp_path / "state"), "--model-dir", str(models), "sweep", "m",
         "--runs", "5", "--budget-s", "0.05", *extra],
        capture_output=True, text=True, timeout=600)


def test_sweep_every_profile_then_the_board_is_as_it_was(tmp_path: Path) -> None:
    fake = build_tree(tmp_path / "orin", "orin")
    before = fake.files()
    try:
        proc = run_sweep(tmp_path, fake.root, "--json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout)
        rows = {r["profile"]: r for r in result["profiles"]}
        assert {"balanced", "performance", "powersave"} <= set(rows)
        for name, row in rows.items():
            assert row["ok"], (name, row)
            assert row["median_ms"] > 0 and len(row["plan"]) == 10
            assert row["power_w"] == pytest.approx(ORIN_VDD_IN_W, rel=1e-6)
            assert row["energy_mj_per_inference"] == pytest.approx(
                row["power_w"] * row["median_ms"], rel=1e-3)
        # each profile really set its clocks while it was measured
        assert rows["performance"]["cpu"]["policy0"]["min_khz"] == 1984000  # min = max
        assert rows["powersave"]["cpu"]["policy0"]["governor"] == "schedutil"
        assert rows["powersave"]["cpu"]["policy0"]["min_khz"] < 1984000
        assert result["fastest"] in rows and result["most_efficient"] in rows
        assert fake.files() == before  # restored byte for byte
    finally:
        fake.close()


def test_unknown_profile_is_reported_and_the_rest_still_run(tmp_path: Path) -> None:
    fake = build_tree(tmp_path / "rpi", "rpi5")
    before = fake.files()
    try:
        proc = run_sweep(tmp_path, fake.root, "--profiles", "turbo,powersave")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "turbo" in proc.stdout and "unknown profile 'turbo'" in proc.stdout
        assert "fewest joules per inference: unknown (no power sensor)" in proc.stdout
        assert fake.files() == before
    finally:
        fake.close()
