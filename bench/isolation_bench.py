"""Per-call cost of a tensor backend in a worker process vs in the daemon vs raw onnxruntime.

Usage: .venv/bin/python bench/isolation_bench.py [--rounds 30] [--calls 200]
       [--widths 64,256,64] [--batch 1] [--out bench/isolation_results.json]

One small generated model (``mlp_stack``, widths 64-256-64, batch 1: ~33 k MACs, so the cost
of crossing to the worker is not hidden by the math) compiled three ways:

- ``process``: ``[backends.onnxruntime] isolation = "process"`` — the executable in
  ``edgepilot worker onnxruntime <model>``, inputs and outputs through shared memory, the
  request and its answer over a unix socket (``IsolatedBackend``, as ``BackendSet`` builds it);
- ``thread``: the same backend in this process (``isolation = "thread"``, the default);
- ``raw``: ``onnxruntime.InferenceSession(...).run`` on the file, what one would write by hand.

Rounds alternate (this machine is shared and noisy: side by side, never one after the other);
each round runs every variant for ``--calls`` calls back to back, in a shuffled order, after 5
untimed ones. Reported: per variant the median over rounds of µs per call, the median of the
per-round ratios (both ran under the same load), and the worker's added µs per call (process -
thread, per round, median). Outputs are checked identical across the three.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgepilot.backends.backend_set import BackendSet
from edgepilot.backends.base import Segment, Target
from edgepilot.backends.onnxrt_options import OnnxRuntimeSection
from edgepilot.formats import onnx_gen

Call = Callable[[], object]


def variants(path: Path, x: np.ndarray) -> tuple[dict[str, Call], list[Callable[[], None]]]:
    segment = Segment(path, "onnx", ("x",), ("y",), None, "bench-mlp")
    target = Target("onnxruntime", "cpu", "fp32")
    calls: dict[str, Call] = {}
    closers = []
    for isolation in ("process", "thread"):
        section = OnnxRuntimeSection(isolation=isolation)  # type: ignore[arg-type]
        backend = BackendSet(lambda _n, s=section: s, ["onnxruntime"]).get("onnxruntime")
        exe = backend.compile(segment, target)
        calls[isolation] = partial(exe.run, {"x": x})
        closers.append(exe.close)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    calls["raw"] = lambda: dict(zip(["y"], sess.run(["y"], {"x": x}), strict=True))
    return calls, closers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--widths", default="64,256,64")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "isolation_results.json")
    args = ap.parse_args()
    widths = tuple(int(w) for w in args.widths.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench-mlp.onnx"
        onnx_gen.mlp_stack(path, widths=widths, batch=args.batch)
        x = np.random.default_rng(0).standard_normal((args.batch, widths[0])).astype(np.float32)
        calls, closers = variants(path, x)
        try:
            outs = {name: call() for name, call in calls.items()}
            for name, out in outs.items():  # the same numbers, whichever way they were run
                assert isinstance(out, dict)
                np.testing.assert_array_equal(out["y"], outs["thread"]["y"], err_msg=name)  # type: ignore[index]
            per_round: dict[str, list[float]] = {name: [] for name in calls}
            order = list(calls)
            rng = random.Random(0)
            for _ in range(args.rounds):
                rng.shuffle(order)
                for name in order:
                    call = calls[name]
                    for _ in range(5):
                        call()
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        call()
                    per_round[name].append((time.perf_counter() - t0) / args.calls * 1e6)
        finally:
            for close in closers:
                close()
    med = {name: statistics.median(v) for name, v in per_round.items()}

    def ratio(a: str, b: str) -> float:
        return statistics.median(p / q for p, q in zip(per_round[a], per_round[b], strict=True))

    added = statistics.median(p - t for p, t in zip(per_round["process"], per_round["thread"],
                                                    strict=True))
    result = {
        "model": f"mlp_stack widths {widths} batch {args.batch}",
        "rounds": args.rounds, "calls_per_round": args.calls,
        "us_per_call": {k: round(v, 1) for k, v in med.items()},
        "ratio_process_vs_thread": round(ratio("process", "thread"), 2),
        "ratio_thread_vs_raw": round(ratio("thread", "raw"), 2),
        "ratio_process_vs_raw": round(ratio("process", "raw"), 2),
        "worker_added_us_per_call": round(added, 1),
        "onnxruntime": ort.__version__,
    }
    print(f"{result['model']}, {args.rounds} alternating rounds x {args.calls} calls")
    for name in ("raw", "thread", "process"):
        print(f"  {name:8s} {med[name]:9.1f} µs/call")
    print(f"  process / thread {result['ratio_process_vs_thread']:.2f}x, thread / raw "
          f"{result['ratio_thread_vs_raw']:.2f}x, process / raw "
          f"{result['ratio_process_vs_raw']:.2f}x; the worker adds {added:.1f} µs per call")
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
