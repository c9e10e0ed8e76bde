"""`edgepilot fleet` against three daemons (subprocesses on fake Orin trees) and one mosquitto,
run as an operator would: the CLI as a process that reaches only the broker.

- `fleet ls --json`: every device from its retained status; `fleet top --once --json`: their
  telemetry, with totals per board kind;
- `fleet rollout profile powersave --canary 1`: the canary's tj zone is driven over its trip
  point once the profile is on it; the rollout stops after the canary, rolls it back (its tree
  byte-identical to before, but for the temperature the test wrote) and leaves the others alone;
- `fleet rollout config FILE`: a bad file refused by the canary, a good one applied and put
  back byte for byte by `config.restore`;
- `fleet run status --group all --json` with one daemon stopped: two replies, the stopped one
  named as not answering, exit status 3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from board_fixtures import BIN_DIR, FakeBoard, build_tree
from daemon_proc import DaemonProcess
from mqtt_fixtures import Broker, Recorder, broker, wait_for  # noqa: F401

TJ = "/sys/devices/virtual/thermal/thermal_zone8"  # tj-thermal
DEVICES = ("a", "b", "c")


def config(brk: Broker, device: str) -> str:
    groups = '["lab", "solo"]' if device == "a" else '["lab"]'
    return f"""
[daemon]
demo_models = false
[telemetry]
sample_interval_s = 0.2
publish_interval_s = 0.5
[mqtt]
host = "{brk.host}"
port = {brk.port}
device_id = "{device}"
groups = {groups}
reconnect_min_s = 0.05
reconnect_max_s = 0.5
[dvfs]
nvpmodel = "{BIN_DIR / 'nvpmodel'}"
jetson_clocks = "{BIN_DIR / 'jetson_clocks'}"
"""


@pytest.fixture
def fleet(tmp_path: Path, broker: Broker) -> Iterator[dict[str, tuple[DaemonProcess, FakeBoard]]]:  # noqa: F811
    made: dict[str, tuple[DaemonProcess, FakeBoard]] = {}
    # a passive trip point on tj-thermal at 95 C, as an Orin's device tree gives it
    trips = {f"{TJ}/trip_point_0_temp": "95000\n", f"{TJ}/trip_point_0_type": "passive\n"}
    try:
        for dev in DEVICES:
            fake = build_tree(tmp_path / f"root-{dev}", "orin", overrides=trips)
            work = tmp_path / dev
            work.mkdir()
            d = DaemonProcess(work, config(broker, dev),
                              extra_args=["--sysfs-root", str(fake.root)],
                              env={"EDGEPILOT_FAKE_ROOT": str(fake.root)})
            made[dev] = (d, fake)
            d.start()
        yield made
    finally:
        for d, fake in made.values():
            if d.proc is not None and d.proc.poll() is None:
                d.stop()
            fake.close()


def cli(brk: Broker, *args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "edgepilot", "fleet", "--host", brk.host,
                           "--port", str(brk.port), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc.returncode, proc.stdout + proc.stderr


def listed(brk: Broker) -> list[dict[str, Any]]:
    rc, out = cli(brk, "ls", "--json")
    assert rc == 0, out
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def test_fleet_ls_rollout_and_run(broker: Broker,  # noqa: F811
                                  fleet: dict[str, tuple[DaemonProcess, FakeBoard]]) -> None:
    rows = wait_for(lambda: (lambda r: r if [x["state"] for x in r] == ["online"] * 3 else None)(
        listed(broker)), timeout=60, what="three devices online")
    assert [r["device_id"] for r in rows] == list(DEVICES)
    assert len({(r["board"], r["family"]) for r in rows}) == 1 and rows[0]["board"], rows
    assert all("lab" in r["groups"] and r["ready"] for r in rows), rows
    rc, text = cli(broker, "ls")
    assert rc == 0 and "DEVICE" in text and "a" in text, text
    rc, out = cli(broker, "top", "--once", "--json", "--interval", "1.5")
    assert rc == 0, out
    top = json.loads(out)
    assert [r["device_id"] for r in top["devices"]] == list(DEVICES)
    assert all(r["power_w"] and r["temp_c"] for r in top["devices"]), top
    assert [(k["devices"], k["online"]) for k in top["kinds"]] == [(3, 3)], top
    assert top["kinds"][0]["power_w"] == pytest.approx(sum(r["power_w"]
                                                           for r in top["devices"]))

    before = {dev: fake.files() for dev, (_, fake) in fleet.items()}
    rec = Recorder(broker, ["edgepilot/+/events"])

    def heat_the_canary() -> None:
        # once the profile is on the canary, its tj zone crosses its trip point
        wait_for(lambda: any(json.loads(m.payload)["type"] == "profile.applied"
                             for m in rec.on("edgepilot/a/events")), timeout=60,
                 what="the canary's profile.applied")
        fleet["a"][1].write(f"{TJ}/temp", "99000\n")

    heater = threading.Thread(target=heat_the_canary)
    heater.start()
    rc, out = cli(broker, "rollout", "profile", "powersave", "--group", "lab", "--canary", "1",
                  "--batch", "50", "--dwell", "30", "--json")
    heater.join(timeout=60)
    assert rc == 1, out
    result = json.loads(out)
    assert result["stopped"] == "canary" and result["changed"] == ["a"], result
    assert result["rolled_back"] == ["a"], result
    assert "tj-thermal at 99.0 C" in " ".join(result["unhealthy"]["a"]), result
    after_a = fleet["a"][1].files()
    changed = {p for p in set(before["a"]) | set(after_a) if before["a"].get(p) != after_a.get(p)}
    assert changed == {f"{TJ}/temp"}, sorted(changed)
    for dev in ("b", "c"):
        assert fleet[dev][1].files() == before[dev], dev
    assert not [m for m in rec.messages if m.topic != "edgepilot/a/events"
                and json.loads(m.payload)["type"].startswith("profile.")]
    rec.close()

    # a config file: a bad one is refused by the canary (nothing written), a good one lands
    # and config.restore puts the old file back byte for byte
    fleet["a"][1].write(f"{TJ}/temp", before["a"][f"{TJ}/temp"].decode())  # cooled down
    path_a = fleet["a"][0].config_path
    assert path_a is not None
    original = path_a.read_bytes()
    bad = path_a.parent / "bad.toml"
    bad.write_text('[telemetry]\nsample_interval_s = "fast"\n')
    rc, out = cli(broker, "rollout", "config", str(bad), "--group", "lab", "--dwell", "1",
                  "--json")
    assert rc == 1, out
    result = json.loads(out)
    assert result["stopped"] == "canary" and list(result["unhealthy"]) == ["a"], result
    assert "telemetry.sample_interval_s" in result["unhealthy"]["a"][0], result
    assert path_a.read_bytes() == original
    good = path_a.parent / "good.toml"
    good.write_bytes(original.replace(b"publish_interval_s = 0.5", b"publish_interval_s = 0.7"))
    rc, out = cli(broker, "rollout", "config", str(good), "--group", "solo", "--dwell", "1",
                  "--json")
    assert rc == 0 and json.loads(out)["changed"] == ["a"], out
    assert path_a.read_bytes() == good.read_bytes()
    rc, out = cli(broker, "run", "config.restore", "--device", "a", "--json")
    assert rc == 0 and json.loads(out)["replies"]["a"]["result"]["restored"], out
    assert path_a.read_bytes() == original

    assert fleet["c"][0].stop() == 0
    rc, out = cli(broker, "run", "status", "--group", "all", "--json", "--timeout", "3")
    assert rc == 3, out
    run = json.loads(out)
    assert sorted(run["replies"]) == ["a", "b"] and run["not_answering"] == ["c"], run
    assert all(r["ok"] and r["result"]["ready"] for r in run["replies"].values()), run
    rc, text = cli(broker, "run", "status", "--group", "lab", "--timeout", "3")
    assert rc == 3 and "not answering: c" in text, text
