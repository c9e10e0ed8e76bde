"""A fleet on one machine: N daemons (default 100) on one mosquitto, then through two bridged.

    .venv/bin/python bench/fleet_bench.py [--devices 100] [--json bench/fleet_results.json]

Each daemon is the real one as a subprocess (`edgepilot run`, the smallest config: no demo
models, onnxruntime only, no kernel corpus, telemetry every 5 s) on a fake Jetson Orin NX tree
built from tests/boards; all of them serve one generated MLP. Measured, in one run:

1. start-up: every daemon's retained status seen by `FleetClient` (what `fleet ls` lists);
2. a group command (`status` on `<prefix>/group/bench/cmd/status`): replies / devices and the
   time to the last reply, against one device asked alone (the ratio);
3. plan adoption: device 0 plans the model (measured), then one group `plan.get` makes the
   others plan it: `plan.adopted` events counted, adoption time against the first board's
   planning time (median ratio), time to the last adoption;
4. mosquitto's CPU seconds over the run and the daemons' RSS;
5. the same statuses and group command through two brokers bridged the way sites are
   connected (daemons on the board-side broker, the client on the core broker, bridge
   ``edgepilot/#`` both ways): time to the last reply against the direct one (the ratio).

The bridge is up from the start (so 1-4 are measured on the site broker while it also forwards
everything to the core one; the site broker's CPU includes that).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from board_fixtures import build_tree  # noqa: E402
from daemon_proc import DaemonProcess, free_port  # noqa: E402

from edgepilot.config import MqttSection  # noqa: E402
from edgepilot.fleet.client import FleetClient  # noqa: E402
from edgepilot.formats.onnx_gen import mlp_stack  # noqa: E402

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def start_broker(work: Path, port: int, bridge_to: int | None = None) -> subprocess.Popen[bytes]:
    work.mkdir(parents=True, exist_ok=True)
    lines = [f"listener {port} 127.0.0.1", "allow_anonymous true", "log_dest stderr",
             "log_type error", "max_queued_messages 100000"]
    if os.geteuid() == 0:
        lines.append("user root")
    if bridge_to is not None:
        # board-side broker -> core broker: everything under edgepilot/ both ways, retained kept
        lines += ["connection core", f"address 127.0.0.1:{bridge_to}",
                  "topic edgepilot/# both 1", "topic edgepilot-fleet/# both 1",
                  "bridge_protocol_version mqttv50", "restart_timeout 1",
                  "cleansession true"]
    conf = work / "mosquitto.conf"
    conf.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=open(work / "mosquitto.log", "ab"))  # noqa: SIM115
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            import socket

            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"mosquitto on {port} did not start: {(work / 'mosquitto.log').read_text()}")


def config(port: int, device: str, models: Path) -> str:
    return f"""
[daemon]
demo_models = false
model_dir = "{models}"
[telemetry]
sample_interval_s = 1.0
publish_interval_s = 5.0
[mqtt]
host = "127.0.0.1"
port = {port}
device_id = "{device}"
groups = ["bench"]
reconnect_min_s = 0.5
reconnect_max_s = 5
[backends]
enabled = ["onnxruntime"]
[dispatch]
kernel_corpus = false
profile_runs = 3
[fleet]
verify_tolerance = 50
"""


def wait(pred: Any, timeout: float, what: str, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    raise RuntimeError(f"timed out waiting for {what}")


def online(fleet: FleetClient, n: int) -> bool:
    with fleet.lock:
        ok = [d for d in fleet.devices.values() if d.online
              and (d.status.get("fleet") or {}).get("fingerprint")]
    return len(ok) >= n


def group_status(fleet: FleetClient, names: list[str], timeout: float) -> dict[str, Any]:
    alone = fleet.run("status", devices=names[:1], timeout_s=timeout)
    res = fleet.run("status", devices=names, group="bench", timeout_s=timeout)
    last = max(res.elapsed_s.values()) if res.elapsed_s else None
    one = alone.elapsed_s.get(names[0])
    return {"replies": len(res.replies), "devices": len(names), "missing": res.missing,
            "time_to_last_s": last, "one_device_s": one,
            "ratio_last_vs_one": round(last / one, 2) if last and one else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=100)
    ap.add_argument("--wave", type=int, default=10, help="daemons started at a time")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    n = args.devices
    tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    core_port, site_port = free_port(), free_port()
    # the core broker first: a bridge forwards what is published while it is up (retained
    # messages published before it connected are not sent over again)
    core: subprocess.Popen[bytes] | None = start_broker(tmp / "core", core_port)
    site = start_broker(tmp / "site", site_port, bridge_to=core_port)
    tree = build_tree(tmp / "orin", "orin")
    models = tmp / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(64, 256, 256, 64), batch=4)
    daemons: list[DaemonProcess] = []
    results: dict[str, Any] = {"devices": n, "cpus": os.cpu_count()}
    mqtt = MqttSection(host="127.0.0.1", port=site_port, device_id="bench-client")
    try:
        t0 = time.monotonic()
        with FleetClient(mqtt, connect_timeout_s=30) as fleet:
            fleet.subscribe("edgepilot/+/events")
            for i in range(n):
                work = tmp / f"d{i:03d}"
                work.mkdir()
                d = DaemonProcess(work, config(site_port, f"d{i:03d}", models),
                                  extra_args=["--sysfs-root", str(tree.root)])
                d.start(wait_healthy=False)
                daemons.append(d)
                if (i + 1) % args.wave == 0:
                    wait(lambda k=i + 1: online(fleet, k), 600, f"{i + 1} daemons online")
            wait(lambda: online(fleet, n), 600, "every daemon online")
            results["startup_s"] = round(time.monotonic() - t0, 1)
        names = [f"d{i:03d}" for i in range(n)]
        # 1. fleet ls from a fresh client: every retained status
        t = time.monotonic()
        with FleetClient(mqtt, connect_timeout_s=30) as fleet:
            results["ls"] = {"listed": len(fleet.devices), "s": round(time.monotonic() - t, 3)}
            fleet.subscribe("edgepilot/+/events")
            time.sleep(0.5)
            # 2. a group command, direct
            results["group_status"] = group_status(fleet, names, 30)
            # 3. plan adoption: one board measures, the others adopt through one group command
            first = fleet.run("plan.get", {"model": "mlp"}, devices=names[:1], timeout_s=120)
            wait(lambda: any(e.get("type") == "plan.published" for e in fleet.events), 120,
                 "the first plan published")
            planned = next(e for e in fleet.events if e.get("type") == "plan.published")
            t, t_wall = time.monotonic(), time.time()
            rest = fleet.run("plan.get", {"model": "mlp"}, devices=names[1:], group="bench",
                             timeout_s=5)

            def adopted() -> list[dict[str, Any]]:
                with fleet.lock:
                    return [e for e in fleet.events if e.get("type") == "plan.adopted"]

            def settled() -> bool:
                # every other board adopted, or refused the plan and published its own
                with fleet.lock:
                    own = [e for e in fleet.events if e.get("type") == "plan.published"]
                return len(adopted()) + len(own) - 1 >= n - 1

            with contextlib.suppress(RuntimeError):  # how many did is the figure
                wait(settled, 900, "adoptions", step=0.5)
            got = adopted()
            ratios = [e["ratio"] for e in got if e.get("ratio") is not None]
            results["adoption"] = {
                "first_planning_s": planned.get("planning_s"),
                "first_reply": bool((first.replies.get(names[0]) or {}).get("ok")),
                "group_acks_in_5s": len(rest.replies),
                "adopted": len(got), "of": n - 1,
                "rejected": sum(1 for e in fleet.events if e.get("type") == "plan.rejected"),
                "rejections": sorted({e.get("reason", "")[:60] for e in fleet.events
                                      if e.get("type") == "plan.rejected"}),
                "waited_s": round(time.monotonic() - t, 1),
                # from the group command to the last plan.adopted (its own timestamp)
                "time_to_last_adoption_s": round(max(e["ts"] for e in got) - t_wall, 2)
                if got else None,
                "adopt_s_median": statistics.median(e["adopt_s"] for e in got) if got else None,
                "ratio_adopt_vs_plan_median": statistics.median(ratios) if ratios else None}
        # 4. broker CPU, daemon RSS
        broker_cpu = psutil.Process(site.pid).cpu_times()
        mem = [psutil.Process(d.proc.pid).memory_full_info() for d in daemons if d.proc]
        results["site_broker_cpu_s"] = round(broker_cpu.user + broker_cpu.system, 2)
        # RSS counts the shared libraries in every process; USS is what each one adds
        for key, values in (("daemon_rss_mb", [m.rss for m in mem]),
                            ("daemon_uss_mb", [m.uss for m in mem])):
            results[key] = {"median": round(statistics.median(values) / 2**20, 1),
                            "max": round(max(values) / 2**20, 1),
                            "sum": round(sum(values) / 2**20)}
        # 5. through the bridge: the client on the core broker, the daemons on the site one
        t = time.monotonic()
        core_cfg = mqtt.model_copy(update={"port": core_port})

        def bridged_ls() -> int:
            with FleetClient(core_cfg, connect_timeout_s=30) as c:
                return len(c.devices)

        try:
            wait(lambda: bridged_ls() >= n, 120, "statuses through the bridge", step=1.0)
        except RuntimeError as exc:
            print(f"bridge: {exc}", file=sys.stderr)
        bridge: dict[str, Any] = {"bridge_up_and_listed_s": round(time.monotonic() - t, 1)}
        with FleetClient(core_cfg, connect_timeout_s=30) as fleet:
            bridge["listed"] = len(fleet.devices)
            bridge["group_status"] = group_status(fleet, names, 30)
        direct, via = results["group_status"]["time_to_last_s"], \
            bridge["group_status"]["time_to_last_s"]
        bridge["ratio_bridged_vs_direct_last"] = round(via / direct, 2) if direct and via else None
        results["bridged"] = bridge
        ct = psutil.Process(core.pid).cpu_times()
        results["core_broker_cpu_s"] = round(ct.user + ct.system, 2)
    finally:
        for d in daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.proc.terminate()
        for d in daemons:
            if d.proc is not None:
                try:
                    d.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    d.proc.kill()
                d._log.close()
        for b in (site, core):
            if b is not None:
                b.terminate()
                b.wait(timeout=10)
        tree.close()
    print(json.dumps(results, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
