"""Daemon CPU use while idle with telemetry at 10 Hz and MQTT publishing, as a fraction of a core.

Starts its own mosquitto on a free loopback port and ``python -m edgepilot run`` (no models),
waits for telemetry to flow, then measures the daemon process's user+system CPU time over a
window with psutil and prints it divided by the wall time. A subscriber counts the telemetry
messages so the number is known to include publishing.

    .venv/bin/python bench/telemetry_cpu.py [--seconds 30] [--sysfs-root DIR] [--publish 1.0]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import psutil
from paho.mqtt.enums import CallbackAPIVersion


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port} after {timeout}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    ap.add_argument("--warmup", type=float, default=5.0, help="ignored start-up time")
    ap.add_argument("--sample", type=float, default=0.1, help="sample_interval_s (10 Hz)")
    ap.add_argument("--publish", type=float, default=1.0, help="publish_interval_s")
    ap.add_argument("--sysfs-root", type=Path, default=None, help="fake board tree (default /)")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    args = ap.parse_args()

    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with tempfile.TemporaryDirectory(prefix="ep-bench-") as tmpdir:
        tmp = Path(tmpdir)
        mport, hport = free_port(), free_port()
        (tmp / "mosquitto.conf").write_text(f"listener {mport} 127.0.0.1\nallow_anonymous true\n")
        (tmp / "edgepilot.toml").write_text(
            f"[daemon]\ndemo_models = false\n"
            f"[telemetry]\nsample_interval_s = {args.sample}\npublish_interval_s = {args.publish}\n"
            f'[mqtt]\nhost = "127.0.0.1"\nport = {mport}\ndevice_id = "bench"\n')
        broker = subprocess.Popen([mosquitto, "-c", str(tmp / "mosquitto.conf")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cmd = [sys.executable, "-m", "edgepilot", "--state-dir", str(tmp / "state"),
               "--config", str(tmp / "edgepilot.toml")]
        if args.sysfs_root is not None:
            cmd += ["--sysfs-root", str(args.sysfs_root)]
        cmd += ["--log-level", "warning", "run", "--port", str(hport)]
        daemon = None
        seen: list[int] = []
        lock = threading.Lock()

        def on_message(_c: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
            with lock:
                seen.append(json.loads(msg.payload)["seq"])

        sub = mqtt.Client(CallbackAPIVersion.VERSION2)
        sub.on_message = on_message
        try:
            wait_port(mport)
            daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_port(hport, timeout=120)
            sub.connect("127.0.0.1", mport)
            sub.subscribe("edgepilot/bench/telemetry", qos=1)
            sub.loop_start()
            time.sleep(args.warmup)
            proc = psutil.Process(daemon.pid)
            c0, t0 = proc.cpu_times(), time.monotonic()
            with lock:
                n0 = len(seen)
            time.sleep(args.seconds)
            c1, t1 = proc.cpu_times(), time.monotonic()
            with lock:
                n1 = len(seen)
            cpu = (c1.user - c0.user) + (c1.system - c0.system)
            frac = cpu / (t1 - t0)
            if args.json:
                print(json.dumps({"cpu_fraction_of_one_core": round(frac, 4),
                                  "sample_hz": round(1 / args.sample, 2),
                                  "publish_interval_s": args.publish,
                                  "messages": n1 - n0, "seconds": round(t1 - t0, 1)}))
            else:
                print(f"daemon CPU idle, telemetry {1 / args.sample:.0f} Hz, MQTT every "
                      f"{args.publish:g} s: {frac:.4f} of one core ({frac * 100:.2f}%), "
                      f"{n1 - n0} messages in {t1 - t0:.0f} s")
            return 0 if n1 > n0 else 1
        finally:
            sub.loop_stop()
            for p in (daemon, broker):
                if p is not None and p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()


if __name__ == "__main__":
    raise SystemExit(main())
