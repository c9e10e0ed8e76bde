"""Prompt lookup decoding, side by side in one run (part 4 of ``bench/gguf_techniques.py``, or
run this file): edgepilot's ``speculative = "prompt_lookup"`` against its plain path, and
llama-cpp-python's own ``LlamaPromptLookupDecoding`` against raw llama-cpp-python's plain path.

Tasks: **copy** (rewrite a 217-token text: one paragraph four times, which the 135M model does
copy), **rewrite-300** (the issue's task: a ~300-token text that does not repeat itself, which
it retells and then loops on) and **chat** (a free-form story), each up to ``max_tokens`` at
temperature 0. Every side runs each task ``rounds``
times, the four sides interleaved round by round (order reversed every other round); the
figures are medians of the whole request's time, and the ratio is plain / lookup of the same
stack. edgepilot's side is the in-process executable the worker serves (``LlamaCppBackend.open``,
thread count set for prompt and batches alike; flash attention on, as ``prompt_lookup`` needs
and both raw sides get too); raw llama-cpp-python gets the same thread count
for its batches (``n_threads_batch``: its default is every core, which would hand the drafted
batches more threads than the single-token decodes). Identity: whether each stack's lookup
answer equals its own plain answer, token for token (compared as text), and the same for a few
more free-form prompts (``IDENTITY``), each once.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

from edgepilot.backends.llamacpp.backend import LlamaCppBackend
from edgepilot.backends.llamacpp.options import LlamacppSection

N_CTX = 4096
# the text the earlier runs copied (a paragraph four times, 217 tokens): SmolLM2-135M copies it
# faithfully
COPY_TEXT = ("The board has four cores and one small GPU. It runs a daemon that serves models to "
             "the devices of the house: lamps, thermostats, door sensors and cameras. Every "
             "device reports its state over MQTT, and the daemon answers questions about "
             "them. ") * 4
# the task, a ~300-token text that does not repeat itself: SmolLM2-135M does not copy
# it, it retells it and then loops
REWRITE_TEXT = (
    "The greenhouse at the end of the garden has three zones. The first holds tomatoes and "
    "peppers, watered at six in the morning for twelve minutes by a valve on the east wall. "
    "The second zone is for seedlings: a heated mat keeps the soil at twenty-two degrees, and "
    "a small fan runs whenever the air above the trays goes over thirty. In the third zone, "
    "herbs grow in long boxes under a shade cloth that a motor rolls out at noon in summer. "
    "A weather station on the roof reports wind, rain and sunlight every minute; when the wind "
    "is stronger than forty kilometres per hour, the vents close and the shade cloth is pulled "
    "back so that it does not tear. Each zone has its own humidity sensor, and the daemon keeps "
    "a week of readings so that the gardener can see how a hot afternoon changed the soil. In "
    "winter the heater in the north corner starts when the inside temperature falls below "
    "eight degrees, and a message is sent to the kitchen display if it has run for more than "
    "two hours without a break. Last spring a valve stuck open during the night and flooded "
    "the seedling trays; since then, the daemon checks the flow meter after every watering and "
    "closes the main tap if water is still running five minutes after the valve was told to "
    "shut. The gardener can also open a vent by hand from the phone, and the daemon writes "
    "down who did it and when, so that the next automatic change does not undo a choice made "
    "on purpose.")
TASKS = {"copy": [{"role": "user", "content": "Rewrite this text exactly:\n\n" + COPY_TEXT}],
         "rewrite-300": [{"role": "user",
                          "content": "Rewrite this text exactly:\n\n" + REWRITE_TEXT}],
         "chat": [{"role": "user", "content": "Write a story about a robot who paints."}]}
IDENTITY = ["List ten fruits, one per line.", "Explain how a thermostat works.",
            "What should I pack for a weekend in the mountains?",
            "Summarise the plot of a detective story in three sentences."]
MAX_TOKENS = 256  # at least: room for the copy to end by itself
SIDES = ("raw plain", "raw lookup", "edgepilot plain", "edgepilot lookup")


def _answer(side: str, model: Any, msgs: list[dict[str, str]], max_tokens: int
            ) -> tuple[str, float, dict[str, Any]]:
    t0 = time.perf_counter()
    if side.startswith("raw"):
        out = model.create_chat_completion(msgs, max_tokens=max_tokens, temperature=0)
    else:
        model.llm.speculative = "prompt_lookup" if side.endswith("lookup") else "off"
        out = model.chat(msgs, max_tokens=max_tokens, temperature=0)
    return (out["choices"][0]["message"]["content"], time.perf_counter() - t0,
            out["usage"])


def bench_lookup(path: Path, threads: int, rounds: int, max_tokens: int) -> dict[str, Any]:
    """Speedups (plain / lookup, medians) and identity of both stacks on both tasks."""
    raw = {name: llama_cpp.Llama(str(path), n_ctx=N_CTX, n_threads=threads,
                                 n_threads_batch=threads, seed=0, verbose=False,
                                 flash_attn=True, **kw)
           for name, kw in (("raw plain", {}), ("raw lookup", {
               # logits_all as its draft_model forces anyway: without it llama-cpp-python
               # 0.3.36 sizes its score rows by n_batch and fails past 512 tokens
               "draft_model": LlamaPromptLookupDecoding(num_pred_tokens=10),
               "logits_all": True}))}
    exe = LlamaCppBackend(LlamacppSection(n_ctx=N_CTX, prefix_cache_entries=0, flash_attn=True,
                                          speculative="prompt_lookup")).open(path)
    exe.set_threads(threads)
    models = {**raw, "edgepilot plain": exe, "edgepilot lookup": exe}
    res: dict[str, Any] = {"threads": threads, "rounds": rounds, "max_tokens": max_tokens}
    for task, msgs in TASKS.items():
        times: dict[str, list[float]] = {s: [] for s in SIDES}
        texts: dict[str, str] = {}
        usage: dict[str, Any] = {}
        for r in range(rounds):
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                _answer(side, models[side], msgs, 2)  # the prompt in the KV: decode is timed
                texts[side], dt, usage[side] = _answer(side, models[side], msgs, max_tokens)
                times[side].append(dt)
        med = {s: statistics.median(v) for s, v in times.items()}
        lookup = exe.llm.lookup
        res[task] = {
            "seconds": {s: round(v, 3) for s, v in med.items()},
            "completion_tokens": usage["edgepilot plain"]["completion_tokens"],
            "edgepilot_speedup": round(med["edgepilot plain"] / med["edgepilot lookup"], 3),
            "raw_lookup_speedup": round(med["raw plain"] / med["raw lookup"], 3),
            "edgepilot_identical": texts["edgepilot lookup"] == texts["edgepilot plain"],
            "raw_identical": texts["raw lookup"] == texts["raw plain"],
            "edgepilot_plain_equals_raw_plain": texts["edgepilot plain"] == texts["raw plain"],
            "drafts": usage["edgepilot lookup"].get("completion_tokens_details"),
            "switched_off": lookup.off if lookup is not None else None}
    same = []
    for prompt in IDENTITY:
        msgs = [{"role": "user", "content": prompt}]
        a = _answer("edgepilot plain", exe, msgs, max_tokens)[0]
        b, _, u = _answer("edgepilot lookup", exe, msgs, max_tokens)
        same.append({"prompt": prompt, "identical": a == b,
                     "drafts": u.get("completion_tokens_details"),
                     "switched_off": exe.llm.lookup.off if exe.llm.lookup else None})
    res["free_form_identity"] = same
    for llm in raw.values():
        llm.close()
    exe.close()
    return res


def report(res: dict[str, Any]) -> list[str]:
    """One line per task, then the identity line."""
    lines = []
    for task in TASKS:
        r = res[task]
        lines.append(
            f"lookup      {task}: edgepilot x{r['edgepilot_speedup']} (identical "
            f"{r['edgepilot_identical']}, drafts {r['drafts']}, off: {r['switched_off'] or '-'})"
            f" | llama-cpp-python's LlamaPromptLookupDecoding x{r['raw_lookup_speedup']} "
            f"(identical {r['raw_identical']}) | {r['completion_tokens']} tokens")
    ids = res["free_form_identity"]
    lines.append(f"lookup      free-form identity: {sum(i['identical'] for i in ids)}/{len(ids)} "
                 "prompts identical to edgepilot's plain path")
    return lines


if __name__ == "__main__":
    import argparse
    import json
    import os

    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    a = ap.parse_args()
    out = bench_lookup(a.model.resolve(), a.threads, a.rounds, a.max_tokens)
    print(json.dumps(out, indent=1))
    print("\n".join(report(out)))
