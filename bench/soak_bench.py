"""Soak: the daemon under mixed traffic for a while, its memory (RSS) sampled throughout.

Usage: .venv/bin/python bench/soak_bench.py [--seconds 300] [--bound-mb 40] [--out FILE]

One real daemon on its embedded default (the demo GGUF and ONNX models) serves, at once and
without pause: tensor requests (JSON and .npy), short chats (plain and streamed), telemetry and
status reads, and a share of bad requests (unknown models, malformed JSON, wrong shapes, deep
nesting) that must be answered 4xx. RSS is sampled every 2 s; the first 20% of the run is
warm-up (models load, allocators settle). Exits 1 when RSS grew by more than ``--bound-mb``
from the end of warm-up to the end, or when any request got a 5xx or no answer.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from daemon_proc import DaemonProcess  # noqa: E402

X = [0.1] * 64
INFER = {"inputs": {"x": {"data": X, "dtype": "float32", "shape": [1, 64]}}}
CHAT = {"model": "demo-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
BAD: list[tuple[str, str, bytes]] = [
    ("POST", "/v1/infer/nope", json.dumps(INFER).encode()),
    ("POST", "/v1/infer/demo-mlp", b"{not json"),
    ("POST", "/v1/infer/demo-mlp", json.dumps(
        {"inputs": {"x": {"data": [1.0, 2.0], "dtype": "float32", "shape": [4294967296, 2]}}}
    ).encode()),
    ("POST", "/v1/commands/status", b"[" * 2000 + b"]" * 2000),
    ("POST", "/v1/chat/completions", json.dumps({"model": "demo-chat"}).encode()),
]


def call(base: str, method: str, path: str, body: bytes | None = None) -> int:
    req = urllib.request.Request(base + path, data=body, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--bound-mb", type=float, default=40.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "soak_results.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="edgepilot-soak-"))
    d = DaemonProcess(tmp, "[mqtt]\nenabled = false\n[http]\nmax_queue = 256\n").start()
    assert d.proc is not None
    proc = psutil.Process(d.proc.pid)
    d.wait_for("/readyz", timeout=120)
    stop = time.monotonic() + args.seconds
    counts: dict[str, int] = {}
    failures: list[str] = []
    lock = threading.Lock()

    def note(kind: str, code: int, ok: bool) -> None:
        with lock:
            counts[kind] = counts.get(kind, 0) + 1
            if not ok:
                failures.append(f"{kind}: {code}")

    def traffic(kind: str) -> None:
        i = 0
        while time.monotonic() < stop:
            i += 1
            try:
                if kind == "infer":
                    code = call(d.url, "POST", "/v1/infer/demo-mlp", json.dumps(INFER).encode())
                    note(kind, code, code == 200)
                elif kind == "chat":
                    body = dict(CHAT, stream=bool(i % 2))
                    code = call(d.url, "POST", "/v1/chat/completions", json.dumps(body).encode())
                    note(kind, code, code == 200)
                elif kind == "reads":
                    for path in ("/v1/telemetry", "/v1/commands", "/readyz", "/metrics"):
                        code = call(d.url, "GET", path)
                        note(kind, code, code == 200)
                else:
                    method, path, raw = BAD[i % len(BAD)]
                    code = call(d.url, method, path, raw)
                    note(kind, code, 400 <= code < 500)
            except Exception as exc:  # no answer at all
                note(kind, -1, False)
                failures.append(f"{kind}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=traffic, args=(k,), daemon=True)
               for k in ("infer", "infer", "chat", "reads", "bad")]
    for t in threads:
        t.start()
    samples: list[tuple[float, float]] = []
    t0 = time.monotonic()
    while time.monotonic() < stop:
        samples.append((time.monotonic() - t0, proc.memory_info().rss / 2**20))
        time.sleep(2.0)
    for t in threads:
        t.join(timeout=180)
    samples.append((time.monotonic() - t0, proc.memory_info().rss / 2**20))
    rc = d.stop()
    warm = [rss for t, rss in samples if t >= 0.2 * args.seconds]
    after_warmup, end, peak = warm[0], samples[-1][1], max(r for _, r in samples)
    growth = end - after_warmup
    result: dict[str, Any] = {
        "seconds": args.seconds, "requests": counts, "failures": failures[:20],
        "n_failures": len(failures), "rss_mb": {"start": round(samples[0][1], 1),
                                                "after_warmup": round(after_warmup, 1),
                                                "end": round(end, 1), "peak": round(peak, 1)},
        "growth_mb": round(growth, 1), "bound_mb": args.bound_mb, "daemon_exit": rc}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{sum(counts.values())} requests in {args.seconds:.0f} s: {counts}")
    print(f"RSS MB: start {samples[0][1]:.1f}, after warm-up {after_warmup:.1f}, end {end:.1f}, "
          f"peak {peak:.1f}; growth {growth:+.1f} (bound {args.bound_mb})")
    print(f"failures (5xx or unanswered, or a bad request not 4xx): {len(failures)}; "
          f"daemon exit {rc}")
    return 0 if growth <= args.bound_mb and not failures and rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
