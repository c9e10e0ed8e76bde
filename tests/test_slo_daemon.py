"""`[dvfs] slo_ms` + `slo_model` in the daemon, on a reactive fake Orin: the profile picked at
start from the daemon's own measurements is the one the board model says; the measurements
are cached (a restart measures nothing); after a thermal fallback the SLO picks a cooler
profile that still meets it instead of the configured fallback, and the board goes back to
the pick once cool; stop leaves the tree byte-identical. Also the guard's use of the re-pick
on a real ProfileManager, and the config checks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from board_fixtures import BIN_DIR, FakeBoard, build_tree, fake_board
from daemon_proc import DaemonProcess
from mqtt_fixtures import wait_for
from reactive_board import BoardModel, ReactiveBoard
from test_sweep_slo import model_power

from edgepilot.board import Board
from edgepilot.config import parse_config
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.profiles import ProfileStore
from edgepilot.dvfs.thermal_guard import ThermalGuard
from edgepilot.errors import ConfigError
from edgepilot.events import EventBus
from edgepilot.formats.onnx_gen import mlp_stack

__all__ = ["fake_board"]
SLO_MS = 10_000.0
PROFILES = ["balanced", "inference", "maxn", "performance", "powersave"]


def config(root: Path, models: Path, slo_model: str = "m") -> str:
    return f"""
[daemon]
demo_models = false
sysfs_root = "{root}"
model_dir = "{models}"
[dvfs]
slo_ms = {SLO_MS}
slo_model = "{slo_model}"
nvpmodel = "{BIN_DIR / 'nvpmodel'}"
jetson_clocks = "{BIN_DIR / 'jetson_clocks'}"
thermal_dwell_s = 0
[dispatch]
kernel_corpus = false
profile_runs = 3
[telemetry]
sample_interval_s = 0.1
[mqtt]
enabled = false
"""


def limits(fake: FakeBoard, board: ReactiveBoard) -> dict[str, bytes | str]:
    """The tree without the files the reactive board rewrites (power, temperatures, cur)."""
    outputs = board.outputs()
    return {k: v for k, v in fake.files().items() if k not in outputs}


def profile(d: DaemonProcess) -> dict[str, Any]:
    code, body = d.request("GET", "/v1/profile")
    assert code == 200, body
    return body  # type: ignore[no-any-return]


def test_daemon_picks_what_the_board_model_says_caches_it_and_re_picks_after_a_fallback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = build_tree(tmp_path / "root", "orin")
    before = fake.files()
    board = ReactiveBoard(fake.root, BoardModel(util_cpu=0.5, util_gpu=0.5)).start()
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "m.onnx", widths=(32, 64, 32))
    env = {"EDGEPILOT_FAKE_ROOT": str(fake.root)}  # read by the tool emulators only
    (tmp_path / "one").mkdir()
    first = DaemonProcess(tmp_path / "one", config(fake.root, models), env=env)
    second: DaemonProcess | None = None
    try:
        # ---- 1: measured at start, the model's pick applied ---------------------------
        first.start()
        first.wait_for("/readyz", timeout=600)
        slo = profile(first)["slo"]
        assert slo["state"] == "picked" and slo["source"] == "measured" and slo["met"]
        rows = {r["profile"]: r for r in slo["measurements"]}
        assert sorted(rows) == PROFILES and all(r["ok"] for r in rows.values())
        watts = model_power(tmp_path, BoardModel(util_cpu=0.5, util_gpu=0.5), PROFILES,
                            monkeypatch)
        for name, r in rows.items():
            assert r["power_w"] == pytest.approx(watts[name], rel=1e-3), name
        expected = min(rows, key=lambda n: (watts[n] * rows[n]["median_ms"],
                                            rows[n]["p95_ms"], n))
        assert slo["pick"] == expected and profile(first)["active"] == expected
        assert first.stop() == 0
        assert limits(fake, board) == {k: v for k, v in before.items()
                                       if k not in board.outputs()}
        # ---- 2: the same board, model and runtimes: from the cache -------------------
        # the test gives the cached measurements the latencies a real board could show
        # (on a fake tree the host's latency does not follow the fake clocks): inference is
        # the pick; maxn and balanced draw less (cooler) and meet the SLO, maxn for fewer
        # joules; powersave misses the SLO
        cache = next((first.state_dir / "slo").glob("m-*.json"))
        doc = json.loads(cache.read_text())
        energy = {"inference": 1.0, "maxn": 1.2, "balanced": 1.5, "performance": 2.0,
                  "powersave": 0.5}
        for r in doc["rows"]:
            p50 = energy[r["profile"]] / r["power_w"]
            r["median_ms"] = r["p50_ms"] = p50
            r["p95_ms"] = 2 * SLO_MS if r["profile"] == "powersave" else 1.1 * p50
            r["energy_mj_per_inference"] = energy[r["profile"]]
        cache.write_text(json.dumps(doc))
        assert rows["maxn"]["power_w"] < rows["inference"]["power_w"]
        (tmp_path / "two").mkdir()
        second = DaemonProcess(tmp_path / "two", config(fake.root, models), env=env)
        second.state_dir = first.state_dir
        second.start()
        second.wait_for("/readyz", timeout=120)
        slo = profile(second)["slo"]
        assert (slo["source"], slo["pick"]) == ("cache", "inference")
        # heat: tj = ambient + 2.4 C/W x VDD_IN goes over inference's 85 C
        board.set(ambient_c=70.0)
        wait_for(lambda: profile(second)["active"] == "maxn", timeout=60,
                 what="thermal fallback to the SLO's cooler pick")
        state = profile(second)
        assert state["thermal"]["base"] == "inference"
        assert state["thermal"]["fallbacks"] == ["maxn"]
        repick = state["slo"]["last_repick"]
        assert (repick["hot"], repick["profile"], repick["configured_fallback"]) == \
            ("inference", "maxn", "balanced")
        # cool again: back to the pick
        board.set(ambient_c=25.0)
        wait_for(lambda: profile(second)["active"] == "inference", timeout=60,
                 what="return to the SLO pick")
        assert second.stop() == 0
    finally:
        for d in (first, second):
            if d is not None and d.proc is not None and d.proc.poll() is None:
                d.stop()
        board.close()
        fake.close()
    assert fake.files() == before


def test_a_stop_while_measuring_puts_the_board_back_and_caches_nothing(tmp_path: Path) -> None:
    fake = build_tree(tmp_path / "root", "orin")
    before = fake.files()
    board = ReactiveBoard(fake.root, BoardModel()).start()
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "m.onnx", widths=(32, 64, 32))
    (tmp_path / "d").mkdir()
    d = DaemonProcess(tmp_path / "d", config(fake.root, models),
                      env={"EDGEPILOT_FAKE_ROOT": str(fake.root)})
    try:
        d.start()
        wait_for(lambda: "measuring DVFS profiles" in json.dumps(d.request("GET", "/readyz")),
                 timeout=120, what="/readyz saying it measures")
        assert d.request("GET", "/readyz")[0] == 503
        wait_for(lambda: profile(d)["active"] is not None, timeout=120,
                 what="a profile applied for measuring")
        assert d.stop() == 0
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        board.close()
        fake.close()
    assert fake.files() == before
    assert not list((d.state_dir / "slo").glob("*.json"))


def test_the_guard_applies_the_re_pick_or_else_the_configured_fallback(
        fake_board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake = fake_board("orin")
    before = fake.files()
    monkeypatch.setenv("EDGEPILOT_FAKE_ROOT", str(fake.root))  # read by the emulators only
    events = EventBus()
    mgr = ProfileManager(Board(fake.root), ProfileStore(), tmp_path / "state", events,
                         nvpmodel=BIN_DIR / "nvpmodel", jetson_clocks=BIN_DIR / "jetson_clocks")
    asked: list[tuple[str, str | None, list[str]]] = []
    answer: dict[str, str | None] = {"inference": "maxn", "balanced": None}

    def chooser(hot: str, configured: str | None, taken: list[str]) -> str | None:
        asked.append((hot, configured, taken))
        return answer.get(hot)

    guard = ThermalGuard(mgr, events, lambda: 0.0, choose_fallback=chooser)
    mgr.apply("inference")
    ev = guard.check({"tj-thermal": 86.0})
    assert ev is not None and (ev["action"], ev["fallback"], ev["chosen_by"]) == \
        ("fallback", "maxn", "slo")
    assert mgr.active_name == "maxn" and asked == [("inference", "balanced", ["inference"])]
    assert guard.check({"tj-thermal": 79.0})["action"] == "return"  # type: ignore[index]
    # no cooler profile meets the SLO: the configured fallback, as without an SLO
    mgr.apply("balanced")
    ev = guard.check({"tj-thermal": 91.0})
    assert ev is not None and ev["fallback"] == "powersave" and "chosen_by" not in ev
    assert mgr.active_name == "powersave"
    mgr.restore("stop")
    assert fake.files() == before


def test_slo_keys_come_as_a_pair_and_never_with_a_fixed_profile() -> None:
    for dvfs, message in (
            ({"slo_ms": 20}, "dvfs.slo_ms is set but dvfs.slo_model is not"),
            ({"slo_model": "m"}, "dvfs.slo_model is set but dvfs.slo_ms is not"),
            ({"slo_ms": 20, "slo_model": "m", "profile": "balanced"},
             "dvfs.profile = 'balanced' and dvfs.slo_ms both choose the profile applied at "
             "start; allowed: one of them")):
        with pytest.raises(ConfigError) as err:
            parse_config({"dvfs": dvfs})
        assert message in err.value.message and err.value.field == "dvfs"
    for key, value in (("slo_ms", 0), ("power_cap_w", -1), ("power_cap_hysteresis_w", -0.1)):
        with pytest.raises(ConfigError) as err:
            parse_config({"dvfs": {key: value}})
        assert err.value.field == f"dvfs.{key}"
    ok = parse_config({"dvfs": {"slo_ms": 20, "slo_model": "m", "power_cap_w": 7.5}}).dvfs
    assert (ok.slo_ms, ok.slo_model, ok.power_cap_w, ok.power_cap_hysteresis_w) == \
        (20, "m", 7.5, 0.5)


@pytest.mark.parametrize(("slo_model", "message"), [
    ("nope", "[dvfs] slo_model: unknown model 'nope'; available: chat, m"),
    ("chat", "[dvfs] slo_model 'chat' is a .gguf file; allowed: an ONNX or TFLite model"),
])
def test_an_unknown_or_gguf_slo_model_stops_the_start_naming_the_key(
        tmp_path: Path, slo_model: str, message: str) -> None:
    fake = build_tree(tmp_path / "root", "rpi5")
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "m.onnx", widths=(8, 8))
    (models / "chat.gguf").write_bytes(b"GGUF")  # never loaded: refused by its kind first
    d = DaemonProcess(tmp_path, config(fake.root, models, slo_model=slo_model))
    try:
        d.start(wait_healthy=False)
        assert d.proc is not None
        assert d.proc.wait(timeout=120) != 0
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        fake.close()
    out = d.output()
    assert message in out, out[-3000:]
    assert os.path.exists(d.state_dir) and not (d.state_dir / "dvfs-journal.json").exists()


def test_the_daemon_picks_a_best_effort_when_the_plain_pick_is_impossible(
        tmp_path: Path) -> None:
    from edgepilot.lifecycle import Daemon

    daemon = Daemon(parse_config({"daemon": {"state_dir": str(tmp_path)},
                                  "dvfs": {"slo_ms": 5, "slo_model": "m"}}))
    daemon.attach_capabilities({"energy"})
    assert daemon.energy is not None
    picker = daemon.energy.slo

    def row(name: str, p95: float, watts: float | None) -> dict[str, Any]:
        return {"profile": name, "ok": True, "median_ms": p95 / 2, "p95_ms": p95,
                "power_w": watts, "energy_mj_per_inference": watts and watts * p95 / 2}

    assert picker.choose([row("fast", 2, 10), row("slow", 4, 3), row("slower", 6, 1)]) == \
        ("slow", True, None)
    # no power sensor: the slowest profile that still meets 5 ms (the lowest clocks that do)
    name, met, why = picker.choose([row("fast", 2, None), row("slow", 4, None),
                                    row("slower", 6, None)])
    assert (name, met) == ("slow", True) and "reports no power" in (why or "")
    # nobody meets it: the fastest, and it says so
    name, met, why = picker.choose([row("fast", 7, 10), row("slow", 9, 3)])
    assert (name, met) == ("fast", False)
    assert why == "no profile's p95 latency meets 5 ms; the fastest, fast, has p95 7 ms"
    daemon.executor.shutdown()
