"""The low-resource techniques on the GGUF path, side by side in one run (``bench/gguf_bench.py
--part techniques``, or run this file): prefix cache, restart, LoRA adapters, prompt lookup,
KV cache precision.

1. **Interleaved conversations.** Two chats with long system prompts (two agents' device
   lists, ~1,700 tokens each) interleaved for ``--turns`` turns each; time to first token of
   every turn (streamed). Raw llama-cpp-python (one ``Llama``: every switch evicts the other
   conversation), raw with its own ``LlamaRAMCache`` (``set_cache``: llama-cpp-python's
   feature for this), and the daemon over HTTP (prefix cache on, the default).
2. **Restart.** The daemon with ``prefix_cache_spill = true``: one turn of conversation A, a
   clean stop, a new daemon on the same state dir, A's next turn: its TTFT against the cold one.
3. **Adapters.** A random LoRA adapter written with the ``gguf`` package: the daemon's answer by
   ``smol:extract`` against llama-cpp-python's own with ``lora_path`` (temperature 0), and the
   switch cost (TTFT of a request under another adapter than the last vs under the same one).
4. **Prompt lookup** (``bench/gguf_lookup.py``): edgepilot's ``speculative = "prompt_lookup"``
   and llama-cpp-python's own ``LlamaPromptLookupDecoding``, each against its plain path, on
   copy tasks and a free-form chat: speedup and whether the tokens are identical.
5. **KV cache precision.** Raw llama-cpp-python with ``type_k``/``type_v`` f16, q8_0, q4_0 (flash
   attention on): bytes of KV state per context token (``llama_state_seq_get_size``) and decode
   tokens/s, side by side round by round.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf_lookup
import llama_cpp
import openai
from llama_cpp.llama_cache import LlamaRAMCache

from edgepilot.formats.gguf_lora import write_lora

N_CTX = 4096
DEVICES_A = "You control these devices. " + "; ".join(
    f"lamp {i}: room {i % 9}, dimmable, {10 + i % 50} W, scene {i % 4}" for i in range(90))
DEVICES_B = "You read these sensors. " + "; ".join(
    f"thermometer {i}: floor {i % 3}, wing {i % 5}, alarm above {20 + i % 15} C"
    for i in range(90))
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def turn(system: str, i: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system}]
    for j in range(i):
        msgs += [{"role": "user", "content": f"Which device is number {j}?"},
                 {"role": "assistant", "content": f"Number {j}."}]
    return [*msgs, {"role": "user", "content": f"Which device is number {i}?"}]


def ttft_raw(llm: Any, messages: list[dict[str, str]]) -> float:
    t0 = time.perf_counter()
    for chunk in llm.create_chat_completion(messages, max_tokens=4, temperature=0, stream=True):
        if chunk["choices"][0]["delta"].get("content"):
            dt = time.perf_counter() - t0
            break
    else:
        dt = time.perf_counter() - t0
    return dt


def ttft_http(client: openai.OpenAI, messages: list[dict[str, str]], model: str = "smol"
              ) -> float:
    t0 = time.perf_counter()
    dt = None
    stream = client.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                            max_tokens=4, temperature=0, stream=True)
    for chunk in stream:
        if dt is None and chunk.choices and chunk.choices[0].delta.content:
            dt = time.perf_counter() - t0
    return dt if dt is not None else time.perf_counter() - t0


@contextlib.contextmanager
def daemon(work: Path, path: Path, threads: int, extra: str = "",
           adapters: dict[str, Path] | None = None) -> Iterator[openai.OpenAI]:
    models = work / "models"
    models.mkdir(parents=True, exist_ok=True)
    if not (models / "smol.gguf").exists():
        shutil.copy(path, models / "smol.gguf")
    entry = '[[models]]\nname = "smol"\nfile = "smol.gguf"\n'
    if adapters:
        for p in adapters.values():
            shutil.copy(p, models / p.name)
        entry += "adapters = { " + ", ".join(f'{k} = "{p.name}"' for k, p in adapters.items()) \
            + " }\n"
    cfg = work / "edgepilot.toml"
    cfg.write_text(f"[mqtt]\nenabled = false\n[dispatch]\nenabled = false\n"
                   f"[backends.llamacpp]\nn_ctx = {N_CTX}\nn_threads = {threads}\n{extra}\n{entry}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(work / "daemon.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgepilot", "--config", str(cfg), "--state-dir",
         str(work / "state"), "--model-dir", str(models), "run", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=2):
                    break
            except OSError:
                time.sleep(0.1)
        yield openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=600)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def med(values: list[float]) -> float:
    return round(statistics.median(values), 4)


# ---- 1. interleaved conversations -----------------------------------------------------------
def bench_interleaved(path: Path, work: Path, threads: int, turns: int) -> dict[str, Any]:
    order = [(s, i) for i in range(turns) for s in (DEVICES_A, DEVICES_B)]
    out: dict[str, Any] = {}
    for name in ("raw", "raw_ramcache"):
        llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_threads=threads, seed=0, verbose=False)
        if name == "raw_ramcache":
            llm.set_cache(LlamaRAMCache(capacity_bytes=2 << 30))
        times = [ttft_raw(llm, turn(s, i)) for s, i in order]
        prompt_tokens = llm.create_chat_completion(turn(DEVICES_A, 0), max_tokens=1)[  # type: ignore[arg-type,index]
            "usage"]["prompt_tokens"]
        llm.close()
        out[name] = times
    with daemon(work / "interleaved", path, threads) as client:
        ttft_http(client, QUESTION)  # loaded
        out["daemon"] = [ttft_http(client, turn(s, i)) for s, i in order]
    res: dict[str, Any] = {"turns_each": turns, "prompt_tokens_first_turn": prompt_tokens}
    for name, times in out.items():
        cold, warm = times[:2], times[2:]
        res[name] = {"ttft_s": [round(t, 3) for t in times], "cold_s": med(cold),
                     "later_turns_s": med(warm), "cold_over_later": round(med(cold) / med(warm), 1)}
    res["daemon_later_over_raw_later"] = round(
        res["daemon"]["later_turns_s"] / res["raw"]["later_turns_s"], 3)
    return res


# ---- 2. restart ---------------------------------------------------------------------------------
def bench_restart(path: Path, work: Path, threads: int) -> dict[str, Any]:
    where = work / "restart"
    extra = "prefix_cache_spill = true"
    with daemon(where, path, threads, extra) as client:
        ttft_http(client, QUESTION)
        cold = ttft_http(client, turn(DEVICES_A, 0))
    spilled = sorted(p.name for p in (where / "state").rglob("*.kv"))
    with daemon(where, path, threads, extra) as client:
        ttft_http(client, QUESTION)
        after = ttft_http(client, turn(DEVICES_A, 1))
    return {"cold_first_turn_s": round(cold, 3), "after_restart_next_turn_s": round(after, 3),
            "cold_over_after_restart": round(cold / after, 1), "spilled_files": len(spilled)}


# ---- 3. adapters --------------------------------------------------------------------------------
def bench_adapters(path: Path, work: Path, threads: int, rounds: int) -> dict[str, Any]:
    lora = write_lora(work / "extract.gguf", path, scale=0.5)
    raw = {}
    for name, lp in (("base", None), ("extract", str(lora))):
        llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_threads=threads, seed=0, verbose=False,
                              lora_path=lp)
        out: Any = llm.create_chat_completion(QUESTION, max_tokens=16, temperature=0)  # type: ignore[arg-type]
        raw[name] = out["choices"][0]["message"]["content"]
        llm.close()
    with daemon(work / "adapters", path, threads, adapters={"extract": lora}) as client:
        def answer(model: str) -> str:
            out = client.chat.completions.create(model=model, messages=QUESTION,  # type: ignore[arg-type]
                                                 max_tokens=16, temperature=0)
            return str(out.choices[0].message.content)
        got = {"base": answer("smol"), "extract": answer("smol:extract")}
        same: list[float] = []
        switch: list[float] = []
        for _ in range(rounds):
            ttft_http(client, QUESTION, "smol:extract")
            same.append(ttft_http(client, QUESTION, "smol:extract"))
            switch.append(ttft_http(client, QUESTION, "smol"))
    return {"identical_to_llama_cpp_lora_path": got["extract"] == raw["extract"],
            "base_identical_to_raw_base": got["base"] == raw["base"],
            "adapter_changes_answer": raw["extract"] != raw["base"],
            "ttft_same_adapter_s": med(same), "ttft_after_switch_s": med(switch),
            "switch_cost_ms": round((med(switch) - med(same)) * 1e3, 1)}


# ---- 4. prompt lookup: bench/gguf_lookup.py ------------------------------------------------------


# ---- 5. KV cache precision ----------------------------------------------------------------------
def bench_kv(path: Path, threads: int, rounds: int, max_tokens: int) -> dict[str, Any]:
    types = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0,
             "q4_0": llama_cpp.GGML_TYPE_Q4_0}
    llms = {k: llama_cpp.Llama(str(path), n_ctx=N_CTX, n_threads=threads, seed=0, verbose=False,
                               flash_attn=True, type_k=t, type_v=t) for k, t in types.items()}
    msgs = [{"role": "user", "content": "Write a long story about a robot who learns to paint."}]
    rates: dict[str, list[float]] = {k: [] for k in types}
    per_token: dict[str, float] = {}
    for r in range(rounds):
        for k in list(types) if r % 2 == 0 else list(types)[::-1]:
            llm = llms[k]
            times = []
            for chunk in llm.create_chat_completion(msgs, max_tokens=max_tokens,  # type: ignore[arg-type]
                                                    temperature=0, stream=True):
                if chunk["choices"][0]["delta"].get("content"):
                    times.append(time.perf_counter())
            rates[k].append((len(times) - 1) / (times[-1] - times[0]))
            per_token[k] = llama_cpp.llama_state_seq_get_size(llm.ctx, 0) / llm.n_tokens
    for llm in llms.values():
        llm.close()
    out: dict[str, Any] = {}
    for k in types:
        ratio = statistics.median(a / b for a, b in zip(rates[k], rates["f16"], strict=True))
        out[k] = {"kv_bytes_per_token": round(per_token[k]), "decode_tokens_per_s": med(rates[k]),
                  "decode_over_f16": round(ratio, 3)}
    return out


def report(res: dict[str, Any]) -> None:
    """The figures of :func:`run`, one line each."""
    it, rs, ad = res["interleaved"], res["restart"], res["adapters"]
    for side in ("raw", "raw_ramcache", "daemon"):
        r = it[side]
        print(f"interleaved {side:13s} TTFT first turn {r['cold_s']:.2f} s | later turns "
              f"{r['later_turns_s']:.3f} s (x{r['cold_over_later']} faster)")
    print(f"interleaved ({it['prompt_tokens_first_turn']}-token system prompts, "
          f"{it['turns_each']} turns each): daemon later turns / raw later turns "
          f"x{it['daemon_later_over_raw_later']}")
    print(f"restart     first turn cold {rs['cold_first_turn_s']:.2f} s | next turn after a "
          f"daemon restart {rs['after_restart_next_turn_s']:.3f} s "
          f"(x{rs['cold_over_after_restart']} faster, {rs['spilled_files']} spilled file(s))")
    print(f"adapters    identical to llama-cpp-python lora_path: "
          f"{ad['identical_to_llama_cpp_lora_path']}; base identical: "
          f"{ad['base_identical_to_raw_base']}; switch cost {ad['switch_cost_ms']} ms TTFT")
    for line in gguf_lookup.report(res["prompt_lookup"]):
        print(line)
    for k, r in res["kv_cache"].items():
        print(f"kv cache    {k:5s} {r['kv_bytes_per_token']} bytes/token | decode "
              f"{r['decode_tokens_per_s']:.1f} tok/s (x{r['decode_over_f16']} of f16)")


def run(path: Path, work: Path, *, threads: int, turns: int, rounds: int,
        max_tokens: int) -> dict[str, Any]:
    """Every part, printed as it finishes; the results as one dict."""
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    res: dict[str, Any] = {"threads": threads}
    parts = [("interleaved", lambda: bench_interleaved(path, work, threads, turns)),
             ("restart", lambda: bench_restart(path, work, threads)),
             ("adapters", lambda: bench_adapters(path, work, threads, rounds)),
             ("prompt_lookup", lambda: gguf_lookup.bench_lookup(
                 path, threads, rounds, max(max_tokens, gguf_lookup.MAX_TOKENS))),
             ("kv_cache", lambda: bench_kv(path, threads, rounds, max_tokens))]
    for name, fn in parts:
        res[name] = fn()
        print(name, json.dumps(res[name]), flush=True)
    return res


if __name__ == "__main__":
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name(
        "gguf_techniques_results.json"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gguf-tech-") as tmp:
        results = run(a.model.resolve(), Path(tmp), threads=a.threads, turns=a.turns,
                      rounds=a.rounds, max_tokens=a.max_tokens)
    a.out.write_text(json.dumps(results, indent=1) + "\n")
