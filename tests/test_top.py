"""``edgepilot top`` and energy per request against a real daemon on a fake Jetson Orin NX.

The daemon runs as a subprocess on the fake Orin tree (its INA3221 rails give real power
readings), serves a generated ONNX MLP and a generated GGUF; ``top --once`` runs as a real CLI
subprocess and the live view is driven by Textual's test pilot over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from board_fixtures import FakeBoard, build_tree, three_policy_board
from daemon_proc import DaemonProcess, free_port
from models_fixtures import gguf_path, module_tmp  # noqa: F401 - fixtures
from mqtt_fixtures import Broker, Recorder, broker, wait_for  # noqa: F401 - fixtures

from edgepilot.formats.onnx_gen import mlp_stack
from edgepilot.top.app import TopApp

ZONES = "/sys/devices/virtual/thermal"
# trip points as a Jetson's cpu/gpu zones have them (the snapshot did not record any)
TRIPS = {f"{ZONES}/thermal_zone0/trip_point_0_temp": "99000\n",
         f"{ZONES}/thermal_zone0/trip_point_0_type": "passive\n",
         f"{ZONES}/thermal_zone0/trip_point_1_temp": "104500\n",
         f"{ZONES}/thermal_zone0/trip_point_1_type": "critical\n",
         f"{ZONES}/thermal_zone1/trip_point_0_temp": "99000\n",
         f"{ZONES}/thermal_zone1/trip_point_0_type": "passive\n"}
CONFIG = """[mqtt]
enabled = false
[dvfs]
profile = "powersave"
[telemetry]
sample_interval_s = 0.1
publish_interval_s = 60
[dispatch]
kernel_corpus = false
profile_runs = 3
[backends.llamacpp]
n_ctx = 256
"""
MESSAGES = [{"role": "user", "content": "hello the board"}]


@pytest.fixture(scope="module")
def orin(module_tmp: Path) -> Iterator[FakeBoard]:  # noqa: F811
    fake = build_tree(module_tmp / "root", "orin", overrides=TRIPS)
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def daemon(module_tmp: Path, orin: FakeBoard, gguf_path: Path  # noqa: F811
           ) -> Iterator[DaemonProcess]:
    models = module_tmp / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(16, 32, 16), batch=1)
    mlp_stack(models / "idle.onnx", widths=(8, 8), batch=1)
    mlp_stack(models / "never.onnx", widths=(8, 8), batch=1)   # never asked for anything
    shutil.copy(gguf_path, models / "tiny.gguf")
    d = DaemonProcess(module_tmp, CONFIG, extra_args=["--sysfs-root", str(orin.root),
                                                      "--model-dir", str(models)])
    d.start()
    d.wait_for("/readyz", timeout=120)
    yield d
    assert d.stop() == 0


def infer(d: DaemonProcess, model: str = "mlp", width: int = 16) -> dict[str, Any]:
    x = np.linspace(-1, 1, width, dtype=np.float32).reshape(1, width)
    code, body = d.request("POST", f"/v1/infer/{model}", {"inputs": {"x": {
        "data": x.ravel().tolist(), "dtype": "float32", "shape": [1, width]}}})
    assert code == 200, body
    return body


def metric(text: str, name: str, model: str) -> float:
    m = re.search(rf'^{name}\{{model="{model}"\}} (\S+)$', text, re.M)
    assert m is not None, f"{name}{{model={model}}} not in /metrics"
    return float(m.group(1))


def top(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgepilot", "top", *args],
                          capture_output=True, text=True, timeout=60)


# ---- energy per request ----------------------------------------------------------------------
def test_infer_answers_carry_energy_and_the_counter_adds_them_up(daemon: DaemonProcess) -> None:
    code, before_text = daemon.request("GET", "/metrics")
    assert code == 200
    m = re.search(r'^edgepilot_model_energy_joules_total\{model="mlp"\} (\S+)$', before_text,
                  re.M)
    before = float(m.group(1)) if m else 0.0
    answers = [infer(daemon) for _ in range(5)]
    energies = [a["energy_j"] for a in answers]
    assert all(isinstance(e, float) and e > 0 for e in energies), energies
    # the fake Orin draws ~4.6 W (VDD_IN): a request's share is at most that power over its
    # wall time (shared with nothing here), plus rounding
    power = daemon.request("GET", "/v1/telemetry")[1]["power_w"]
    for a in answers:
        assert a["energy_j"] <= power * (a["latency_ms"] / 1e3) * 1.01 + 1e-6
    code, text = daemon.request("GET", "/metrics")
    after = metric(text, "edgepilot_model_energy_joules_total", "mlp")
    assert after - before >= sum(energies) - 1e-5
    # .npy answers carry it as a header
    buf = subprocess.run([sys.executable, "-c", "import io,sys,numpy as np;b=io.BytesIO();"
                          "np.save(b,np.ones((1,16),np.float32));sys.stdout.buffer.write("
                          "b.getvalue())"], capture_output=True, check=True).stdout
    import urllib.request

    req = urllib.request.Request(daemon.url + "/v1/infer/mlp", data=buf, method="POST",
                                 headers={"Content-Type": "application/x-npy",
                                          "Accept": "application/x-npy"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert float(resp.headers["X-Energy-J"]) > 0


def test_openai_usage_carries_energy_plain_and_streamed(daemon: DaemonProcess) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    got = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                         max_tokens=8, temperature=0)
    assert got.usage is not None
    extra = got.usage.model_extra or {}
    assert extra["energy_j"] > 0
    assert extra["joules_per_token"] * got.usage.completion_tokens == pytest.approx(
        extra["energy_j"], rel=1e-6)
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                            max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None
    sextra = usage.model_extra or {}
    assert sextra["energy_j"] > 0
    assert sextra["joules_per_token"] * usage.completion_tokens == pytest.approx(
        sextra["energy_j"], rel=1e-6)
    comp = client.completions.create(model="tiny", prompt="the board", max_tokens=4,
                                     temperature=0)
    assert comp.usage is not None and (comp.usage.model_extra or {})["energy_j"] > 0
    # the model's counter holds at least what the answers carried
    text = daemon.request("GET", "/metrics")[1]
    total = metric(text, "edgepilot_model_energy_joules_total", "tiny")
    assert total >= extra["energy_j"] + sextra["energy_j"] - 1e-5


def test_without_a_power_sensor_energy_is_null(tmp_path: Path) -> None:
    fake = build_tree(tmp_path / "root", three_policy_board())  # cpufreq only
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(16, 16), batch=1)
    d = DaemonProcess(tmp_path, "[mqtt]\nenabled = false\n[dispatch]\nenabled = false\n"
                                "[telemetry]\nsample_interval_s = 0.1\n",
                      extra_args=["--sysfs-root", str(fake.root), "--model-dir", str(models)])
    try:
        d.start()
        d.wait_for("/readyz", timeout=120)
        body = infer(d)
        assert "energy_j" in body and body["energy_j"] is None   # unknown, not 0
        assert "edgepilot_model_energy_joules_total{" not in d.request("GET", "/metrics")[1]
        out = top("--url", d.url, "--once")
        assert out.returncode == 0, out.stderr
        assert "no power sensor" in out.stdout
    finally:
        assert d.stop() == 0
        fake.close()


def test_mqtt_telemetry_carries_model_energy_and_top_shows_the_broker(
        tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    fake = build_tree(tmp_path / "root", "orin")
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(16, 32, 16), batch=1)
    cfg = (f'[mqtt]\nhost = "{broker.host}"\nport = {broker.port}\ndevice_id = "top"\n'
           "[dispatch]\nenabled = false\n"
           "[telemetry]\nsample_interval_s = 0.1\npublish_interval_s = 0.3\n")
    d = DaemonProcess(tmp_path, cfg, extra_args=["--sysfs-root", str(fake.root),
                                                 "--model-dir", str(models)])
    rec = Recorder(broker, ["edgepilot/top/telemetry"])
    try:
        d.start()
        d.wait_for("/readyz", timeout=120)
        answered = sum(infer(d)["energy_j"] for _ in range(3))

        def carried() -> float:
            last = [m["models"].get("mlp", {}) for m in rec.json_on("edgepilot/top/telemetry")]
            return max((m.get("energy_total_j", 0.0) for m in last), default=0.0)

        # the per-model counter in the published telemetry holds what the answers carried
        wait_for(lambda: carried() >= answered - 1e-5, timeout=60,
                 what="telemetry with the model's energy")
        assert carried() == pytest.approx(answered, abs=1e-5)
        out = top("--url", d.url, "--once")
        assert out.returncode == 0, out.stderr
        mqtt_line = next(ln for ln in out.stdout.splitlines() if ln.startswith("MQTT"))
        assert mqtt_line.startswith(f"MQTT connected {broker.host}:{broker.port}"), mqtt_line
        assert "buffered 0" in mqtt_line and "dropped 0" in mqtt_line
    finally:
        rec.close()
        assert d.stop() == 0
        fake.close()


def test_top_shows_the_power_cap_stepping_clocks_down(tmp_path: Path) -> None:
    fake = build_tree(tmp_path / "root", "orin")
    before = fake.files()
    # the fake Orin draws 4.6 W whatever its clocks: a 2 W cap steps every clock down
    d = DaemonProcess(tmp_path, "[mqtt]\nenabled = false\n[daemon]\ndemo_models = false\n"
                                "[dvfs]\npower_cap_w = 2.0\n"
                                "[telemetry]\nsample_interval_s = 0.1\npublish_interval_s = 0.5\n",
                      extra_args=["--sysfs-root", str(fake.root)])
    try:
        d.start()
        wait_for(lambda: (d.request("GET", "/v1/telemetry")[1].get("power_cap") or {}
                          ).get("steps"), timeout=120, what="a power cap step")
        out = top("--url", d.url, "--once")
        assert out.returncode == 0, out.stderr
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("profile "))
        cap = re.search(r"power cap 2\.0 W: (\w+), (\d+) steps? down \((.*)\)", line)
        assert cap is not None, line
        assert cap.group(1) in ("capping", "saturated") and int(cap.group(2)) >= 1
        assert re.search(r"(policy\d|17000000\.gpu) \d+->\d+", cap.group(3)), line
        assert d.stop() == 0
        assert fake.files() == before  # the cap's steps are undone on stop
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        fake.close()


# ---- top --once ------------------------------------------------------------------------------
def parse_tables(text: str) -> dict[str, dict[str, dict[str, str]]]:
    """``top --once`` text -> {TITLE: {first cell: {column: cell}}} (cells are separated by
    two or more spaces; a cell never is empty, unknown is '-')."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for block in text.split("\n\n")[1:]:
        lines = [ln for ln in block.splitlines() if not ln.strip().startswith("note:")]
        cols = re.split(r"\s{2,}", lines[1].strip())
        rows = [dict(zip(cols, re.split(r"\s{2,}", ln.strip()), strict=True))
                for ln in lines[2:]]
        out[lines[0]] = {r[cols[0]]: r for r in rows}
    return out


def test_top_once_shows_rails_clocks_temperatures_profile_and_models(
        daemon: DaemonProcess) -> None:
    for _ in range(3):
        infer(daemon)
    out = top("--url", daemon.url, "--once")
    assert out.returncode == 0, out.stderr
    tables = parse_tables(out.stdout)
    # rails of the INA3221 and the total, in watts
    power = tables["POWER"]
    for rail in ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC", "total"):
        assert float(power[rail]["W"]) > 0, (rail, out.stdout)
    assert "since start, from ina3221:VDD_IN" in out.stdout
    # temperatures with the trip points read from the zones
    cpu = tables["THERMAL"]["cpu-thermal"]
    assert float(cpu["C"]) > 0
    assert cpu["trip points"] == "passive 99.0, critical 104.5"
    # clocks per cpufreq policy and devfreq device (the Orin's GPU)
    clocks = tables["CLOCKS"]
    assert clocks["policy0"]["kind"].startswith("cpu") and float(clocks["policy0"]["MHz"]) > 0
    assert any(r["kind"] == "gpu" for r in clocks.values()), clocks
    assert "profile powersave" in out.stdout
    assert "MQTT disabled" in out.stdout
    # a row for the model with latency and joules, and one for the model never asked
    mlp = tables["MODELS"]["mlp"]
    assert float(mlp["p50 ms"]) > 0 and float(mlp["p99 ms"]) >= float(mlp["p50 ms"])
    assert mlp["J/inf"] != "-" and mlp["J total"] != "-" and mlp["plan"] != "-", mlp
    assert mlp["kind"] == "onnx"
    idle = tables["MODELS"]["idle"]
    assert idle["req/s"] == "-" and idle["J total"] == "-"


def test_top_once_json_and_errors(daemon: DaemonProcess) -> None:
    infer(daemon)
    out = top("--url", daemon.url, "--once", "--json")
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    m = snap["telemetry"]["models"]["mlp"]
    assert m["latency_p50_ms"] > 0 and m["latency_p99_ms"] >= m["latency_p50_ms"]
    assert m["energy_total_j"] > 0 and m["energy_per_inference_j"] > 0
    assert snap["telemetry"]["trips_c"]["gpu-thermal"] == [{"type": "passive", "temp_c": 99.0}]
    assert snap["errors"] == {}
    # nothing listens: one line naming the address, exit 2
    dead = f"http://127.0.0.1:{free_port()}"
    out = top("--url", dead, "--once")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and dead in out.stderr and "--url" in out.stderr
    out = top("--url", "localhost:8470", "--once")
    assert out.returncode == 2 and "--url" in out.stderr


def test_plan_listing_plans_nothing_and_top_shows_the_segments(daemon: DaemonProcess) -> None:
    infer(daemon)
    code, plan = daemon.request("GET", "/v1/plan/mlp?wait=true", timeout=180)
    assert code == 200, plan
    code, listing = daemon.request("GET", "/v1/plan")
    assert code == 200
    mine = [p for p in listing["plans"] if p["model"] == "mlp"]
    assert mine and mine[-1]["hash"] == plan["hash"]
    assert mine[-1]["segments"] == plan["segments"]
    assert mine[-1]["signature"] == "x=1x16"
    # asking for the listing starts no planning of a model nobody asked for
    for key in ("plans", "planning", "failed"):
        assert all(p["model"] != "never" for p in listing[key]), listing
    assert all(p["model"] != "never" for p in daemon.request("GET", "/v1/plan")[1]["planning"])
    out = top("--url", daemon.url, "--once")
    row = parse_tables(out.stdout)["MODELS"]["mlp"]
    assert row["plan"] == " > ".join(f"{s['target']}[{s['layers'][0]}:{s['layers'][1]}]"
                                     for s in plan["segments"])


# ---- the live view, driven by Textual's pilot -------------------------------------------------
def test_live_view_shows_the_daemon_and_quits_on_q(daemon: DaemonProcess) -> None:
    async def scenario() -> None:
        app = TopApp(daemon.url, interval=0.2)
        async with app.run_test(size=(200, 60)) as pilot:
            await wait_updates(pilot, app, 1)
            power = app.query_one("#power-table")
            rails = [str(power.get_row_at(i)[0]) for i in range(power.row_count)]
            assert "VDD_IN" in rails and "total" in rails
            thermal = app.query_one("#thermal-table")
            cpu = [str(c) for c in thermal.get_row("cpu-thermal")]
            assert cpu[2] == "passive 99.0, critical 104.5"
            clocks = app.query_one("#clocks-table")
            assert clocks.row_count >= 2
            summary = str(app.query_one("#summary").render())
            assert "profile powersave" in summary
            # a request to a model the view has no numbers for yet: its row fills in
            models = app.query_one("#models-table")
            assert str(models.get_row("idle")[3]) == "-"
            await asyncio.to_thread(infer, daemon, "idle", 8)
            seen = app.updates
            await pilot.press("r")
            await wait_updates(pilot, app, seen + 1)
            row = [str(c) for c in models.get_row("idle")]
            # req/s, p50 ms and J total filled in
            assert row[3] != "-" and float(row[5]) > 0 and row[9] != "-", row
            await pilot.press("q")
            await pilot.pause()
            assert not app.is_running
        assert app.return_code == 0

    asyncio.run(scenario())


async def wait_updates(pilot: Any, app: TopApp, count: int) -> None:
    """Let the app run until it has shown ``count`` snapshots (bounded: 600 short pauses)."""
    for _ in range(600):
        if app.updates >= count:
            return
        await pilot.pause(0.05)
    raise AssertionError(f"top showed {app.updates} snapshots, wanted {count}: {app.error}")
