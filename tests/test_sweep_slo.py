"""`edgepilot sweep --csv --plot --slo-ms` on a reactive fake Orin: a row per profile, a PNG,
and the profile the board model says (the power each profile draws on the model, times the
latency measured), the board put back byte for byte."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from board_fixtures import BIN_DIR, build_tree
from reactive_board import BoardModel, ReactiveBoard

from edgepilot.board import Board
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.profiles import ProfileStore
from edgepilot.formats.onnx_gen import mlp_stack

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def sweep(tmp_path: Path, root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    mlp_stack(models / "m.onnx", widths=(32, 64, 32))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[mqtt]\nenabled = false\n[dispatch]\nkernel_corpus = false\n"
                   f"profile_runs = 3\n[dvfs]\nnvpmodel = \"{BIN_DIR / 'nvpmodel'}\"\n"
                   f"jetson_clocks = \"{BIN_DIR / 'jetson_clocks'}\"\n")
    env = {**os.environ, "EDGEPILOT_FAKE_ROOT": str(root)}  # read by the tool emulators only
    return subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--sysfs-root", str(root),
         "--state-dir", str(tmp_path / "state"), "--model-dir", str(models), "sweep", "m",
         "--runs", "5", "--budget-s", "0.05", *extra],
        capture_output=True, text=True, timeout=900, env=env)


def model_power(tmp_path: Path, model: BoardModel, names: list[str],
                monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """The board model's VDD_IN under each profile: each applied to a second fake Orin by a
    real ProfileManager (with the tool emulators), the model evaluated on the tree."""
    fake = build_tree(tmp_path / "oracle", "orin")
    monkeypatch.setenv("EDGEPILOT_FAKE_ROOT", str(fake.root))
    board = ReactiveBoard(fake.root, model)
    mgr = ProfileManager(Board(fake.root), ProfileStore(), tmp_path / "oracle-state",
                         nvpmodel=BIN_DIR / "nvpmodel", jetson_clocks=BIN_DIR / "jetson_clocks")
    watts = {}
    try:
        for name in names:
            mgr.apply(name)
            board.update()
            watts[name] = board.power_w()
            mgr.restore()
    finally:
        board.close()
        fake.close()
    return watts


def test_sweep_names_the_profile_the_board_model_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = build_tree(tmp_path / "orin", "orin")
    before = fake.files()
    model = BoardModel(util_cpu=0.5, util_gpu=0.5)
    board = ReactiveBoard(fake.root, model).start()
    out_csv, out_png = tmp_path / "a.csv", tmp_path / "a.png"
    try:
        proc = sweep(tmp_path, fake.root, "--json", "--csv", str(out_csv), "--plot",
                     str(out_png), "--slo-ms", "10000")
    finally:
        board.close()
        fake.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    rows = {r["profile"]: r for r in result["profiles"]}
    assert set(rows) == {"balanced", "inference", "maxn", "performance", "powersave"}
    assert all(r["ok"] for r in rows.values()), rows
    # the board model, evaluated on each profile's clocks, drew what the sweep measured
    watts = model_power(tmp_path, BoardModel(util_cpu=0.5, util_gpu=0.5), sorted(rows),
                        monkeypatch)
    for name, r in rows.items():
        assert r["power_w"] == pytest.approx(watts[name], rel=1e-3), name
        assert r["p95_ms"] >= r["median_ms"] > 0
    # the profiles really differ on the model: performance pins every clock at max,
    # powersave has half the cores offline and the GPU at half its range
    assert watts["powersave"] < watts["balanced"] < watts["performance"]
    # what the test computes from the model: every profile meets 10 s, so the fewest model
    # joules per inference (model power x measured p50) wins
    expected = min(rows, key=lambda n: (watts[n] * rows[n]["median_ms"], rows[n]["p95_ms"], n))
    assert result["slo_ms"] == 10000
    assert result["slo_pick"] == expected
    assert result["slo_pick"] in result["pareto"]
    assert all(rows[n]["pareto"] == (n in result["pareto"]) for n in rows)
    with open(out_csv, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [t["profile"] for t in table] == [r["profile"] for r in result["profiles"]]
    for t in table:
        assert float(t["p95_ms"]) == rows[t["profile"]]["p95_ms"]
        assert float(t["energy_mj_per_inference"]) == \
            rows[t["profile"]]["energy_mj_per_inference"]
        assert t["slo_pick"] == str(t["profile"] == expected)
        assert t["meets_slo"] == "True"
    png = out_png.read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    # restored byte for byte (the reactive board put its own outputs back when it closed)
    assert fake.files() == before


def test_no_profile_meets_the_slo_names_none_and_why(tmp_path: Path) -> None:
    fake = build_tree(tmp_path / "rpi", "rpi5")
    before = fake.files()
    out_png = tmp_path / "rpi.png"
    try:
        proc = sweep(tmp_path, fake.root, "--profiles", "powersave", "--json", "--slo-ms",
                     "0.000001", "--plot", str(out_png))
        text = sweep(tmp_path, fake.root, "--profiles", "powersave", "--slo-ms", "0.000001")
    finally:
        fake.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["slo_pick"] is None
    assert result["slo_reason"].startswith("no profile's p95 latency meets 1e-06 ms; the "
                                           "fastest, powersave, has p95 ")
    assert result["pareto"] == []  # no power sensor on a Raspberry Pi 5: no energy
    assert out_png.read_bytes().startswith(PNG_MAGIC)
    assert "SLO p95 <= 1e-06 ms: no pick: no profile's p95 latency meets" in text.stdout
    assert fake.files() == before


def test_bad_flags_are_one_line_errors_naming_the_flag(tmp_path: Path) -> None:
    fake = build_tree(tmp_path / "rpi", "rpi5")
    try:
        slo = sweep(tmp_path, fake.root, "--slo-ms", "0")
        where = sweep(tmp_path, fake.root, "--csv", str(tmp_path / "no" / "such" / "a.csv"))
    finally:
        fake.close()
    assert slo.returncode == 2
    assert slo.stderr.strip() == ("edgepilot: error: --slo-ms 0: allowed a latency above 0 and "
                                  "at most 3600000 ms")
    assert where.returncode == 2
    assert where.stderr.strip().endswith(f"the directory {tmp_path / 'no' / 'such'} does not "
                                         "exist")
