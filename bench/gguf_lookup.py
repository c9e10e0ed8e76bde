"""Speculative decoding, side by side in one run (part 4 of ``bench/gguf_techniques.py``, or
run this file): edgepilot's ``speculative = "prompt_lookup"`` (and, with ``--draft FILE`` or
``--draft-layers N``, ``speculative = "draft"``) against its plain path, and llama-cpp-python's
own ``LlamaPromptLookupDecoding`` against raw llama-cpp-python's plain path.

``--draft-layers N`` drafts with the model's own first N transformer blocks (its embedding,
output norm and head kept: the same vocabulary, a real if untrained early-exit draft), written
to a temporary GGUF by :func:`truncated_gguf`; ``--draft FILE`` names any draft GGUF (the
model itself gives every draft taken at the full price of the model).

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
DRAFT_SIDE = "edgepilot draft"


def truncated_gguf(src: Path, dst: Path, n_layers: int) -> Path:
    """``src`` with only its first ``n_layers`` blocks (every other tensor and key as they
    are, ``<arch>.block_count`` set): a draft of the same vocabulary, written to ``dst``."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the reader's own entries; the writer adds the architecture
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = n_layers if key == f"{arch}.block_count" else field.contents()
        writer.add_key_value(key, value, vtype, sub_type=sub)
    kept = [t for t in reader.tensors
            if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < n_layers]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data)
    writer.close()
    return dst


def _answer(side: str, model: Any, msgs: list[dict[str, str]], max_tokens: int
            ) -> tuple[str, float, dict[str, Any]]:
    t0 = time.perf_counter()
    if side.startswith("raw"):
        out = model.create_chat_completion(msgs, max_tokens=max_tokens, temperature=0)
    else:
        model.llm.speculative = {"lookup": "prompt_lookup", "draft": "draft"}.get(
            side.rpartition(" ")[2], "off")
        out = model.chat(msgs, max_tokens=max_tokens, temperature=0)
    return (out["choices"][0]["message"]["content"], time.perf_counter() - t0,
            out["usage"])


def bench_lookup(path: Path, threads: int, rounds: int, max_tokens: int,
                 draft: Path | None = None, raw_sides: bool = True) -> dict[str, Any]:
    """Speedups (plain / lookup, medians) and identity of both stacks on every task; with
    ``draft``, edgepilot's draft-model side too (plain / draft). ``raw_sides=False``: only
    edgepilot's sides (more rounds in the same time)."""
    raw = {name: llama_cpp.Llama(str(path), n_ctx=N_CTX, n_threads=threads,
                                 n_threads_batch=threads, seed=0, verbose=False,
                                 flash_attn=True, **kw)
           for name, kw in (("raw plain", {}), ("raw lookup", {
               # logits_all as its draft_model forces anyway: without it llama-cpp-python
               # 0.3.36 sizes its score rows by n_batch and fails past 512 tokens
               "draft_model": LlamaPromptLookupDecoding(num_pred_tokens=10),
               "logits_all": True}))} if raw_sides else {}
    # one executable for every edgepilot side: the draft (when asked) stays loaded beside it,
    # and each request's speculative setting picks the side
    exe = LlamaCppBackend(LlamacppSection(
        n_ctx=N_CTX, prefix_cache_entries=0, flash_attn=True,
        speculative="prompt_lookup" if draft is None else "draft", draft_model=draft)).open(path)
    if draft is not None and exe.llm.draft_context is None:
        raise SystemExit(f"the draft was refused: {exe.llm.draft_refused}")
    exe.set_threads(threads)
    sides = SIDES if draft is None else (*SIDES, DRAFT_SIDE)
    sides = sides if raw_sides else tuple(x for x in sides if not x.startswith("raw"))
    models = {**raw, "edgepilot plain": exe, "edgepilot lookup": exe, DRAFT_SIDE: exe}
    res: dict[str, Any] = {"threads": threads, "rounds": rounds, "max_tokens": max_tokens,
                           "draft": None if draft is None else draft.name}
    for task, msgs in TASKS.items():
        times: dict[str, list[float]] = {s: [] for s in sides}
        texts: dict[str, str] = {}
        usage: dict[str, Any] = {}
        off: dict[str, str | None] = {}
        cost: dict[str, float] = {}
        for r in range(rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                _answer(side, models[side], msgs, 2)  # the prompt in the KV: decode is timed
                texts[side], dt, usage[side] = _answer(side, models[side], msgs, max_tokens)
                times[side].append(dt)
                if side.startswith("edgepilot"):
                    drafter = exe.llm.drafter
                    off[side] = drafter.off if drafter is not None else None
                    if drafter is not None and drafter.produced and drafter.single_s:
                        # the cost rule's view: drafting's time per token it produced,
                        # against a single-token decode of the model
                        cost[side] = round(drafter.batch_s / drafter.produced
                                           / drafter.single_s, 2)
        med = {s: statistics.median(v) for s, v in times.items()}
        res[task] = {
            "seconds": {s: round(v, 3) for s, v in med.items()},
            "completion_tokens": usage["edgepilot plain"]["completion_tokens"],
            "edgepilot_speedup": round(med["edgepilot plain"] / med["edgepilot lookup"], 3),
            "raw_lookup_speedup": round(med["raw plain"] / med["raw lookup"], 3)
            if raw_sides else None,
            "edgepilot_identical": texts["edgepilot lookup"] == texts["edgepilot plain"],
            "raw_identical": texts.get("raw lookup") == texts.get("raw plain")
            if raw_sides else None,
            "edgepilot_plain_equals_raw_plain": texts["edgepilot plain"] == texts.get("raw plain"),
            "drafts": usage["edgepilot lookup"].get("completion_tokens_details"),
            "switched_off": off["edgepilot lookup"],
            "cost_per_produced": cost.get("edgepilot lookup")}
        if draft is not None:
            res[task].update({
                "draft_speedup": round(med["edgepilot plain"] / med[DRAFT_SIDE], 3),
                "draft_identical": texts[DRAFT_SIDE] == texts["edgepilot plain"],
                "draft_drafts": usage[DRAFT_SIDE].get("completion_tokens_details"),
                "draft_switched_off": off[DRAFT_SIDE],
                "draft_cost_per_produced": cost.get(DRAFT_SIDE)})
    same = []
    for prompt in IDENTITY:
        msgs = [{"role": "user", "content": prompt}]
        a = _answer("edgepilot plain", exe, msgs, max_tokens)[0]
        b, _, u = _answer("edgepilot lookup", exe, msgs, max_tokens)
        row = {"prompt": prompt, "identical": a == b, "drafts": u.get("completion_tokens_details"),
               "switched_off": exe.llm.drafter.off if exe.llm.drafter else None}
        if draft is not None:
            c, _, u = _answer(DRAFT_SIDE, exe, msgs, max_tokens)
            row.update({"draft_identical": a == c,
                        "draft_drafts": u.get("completion_tokens_details"),
                        "draft_switched_off": exe.llm.drafter.off if exe.llm.drafter else None})
        same.append(row)
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
        if "draft_speedup" in r:
            lines.append(
                f"draft       {task}: edgepilot x{r['draft_speedup']} with {res['draft']} "
                f"(identical {r['draft_identical']}, drafts {r['draft_drafts']}, off: "
                f"{r['draft_switched_off'] or '-'}, drafting cost per token it produced "
                f"{r['draft_cost_per_produced']} of a single decode)")
    ids = res["free_form_identity"]
    lines.append(f"lookup      free-form identity: {sum(i['identical'] for i in ids)}/{len(ids)} "
                 "prompts identical to edgepilot's plain path")
    if res.get("draft"):
        lines.append(f"draft       free-form identity: "
                     f"{sum(i['draft_identical'] for i in ids)}/{len(ids)} prompts identical")
    return lines


if __name__ == "__main__":
    import argparse
    import json
    import os
    import tempfile

    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--draft", type=Path, help="a draft GGUF of the model's vocabulary: "
                    "speculative = 'draft' side by side too")
    ap.add_argument("--no-raw", action="store_true", help="edgepilot's sides only")
    ap.add_argument("--draft-layers", type=int, help="draft with the model's first N blocks "
                    "(written to a temporary file)")
    a = ap.parse_args()
    draft_file = a.draft.resolve() if a.draft else None
    tmp = tempfile.TemporaryDirectory()
    if a.draft_layers:
        draft_file = truncated_gguf(a.model.resolve(),
                                    Path(tmp.name) / f"first-{a.draft_layers}-blocks.gguf",
                                    a.draft_layers)
    out = bench_lookup(a.model.resolve(), a.threads, a.rounds, a.max_tokens, draft_file,
                       raw_sides=not a.no_raw)
    print(json.dumps(out, indent=1))
    print("\n".join(report(out)))
