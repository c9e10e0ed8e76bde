"""Raw llama-cpp-python on one GGUF: what a user would run instead of edgepilot's GGUF plan.

Usage: python scripts/raw_gguf_decode.py MODEL.gguf [--prompt-tokens 32] [--decode-tokens 16]
       [--rounds 7]

Times the same reference request as the plan (``dispatch/gguf/measure.py``: a prompt prefilled
in one batch, then tokens decoded one at a time) on ``llama_cpp.Llama(path, n_gpu_layers=N)``
with llama-cpp-python's own defaults otherwise (its thread count), for every block on the GPU
(-1, when the build offloads) and none (0). Prints one JSON object: per setting the medians in
ms per token. Used by ``scripts/device-check.sh`` beside ``plan --json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import llama_cpp

from edgepilot.dispatch.gguf.measure import reference_tokens, time_request


def measure(path: str, n_gpu_layers: int, prompt_tokens: int, decode_tokens: int,
            rounds: int) -> dict[str, Any]:
    """Medians over ``rounds`` (after one warm-up) of prefill and decode ms per token."""
    llm = llama_cpp.Llama(path, n_gpu_layers=n_gpu_layers,
                          n_ctx=prompt_tokens + decode_tokens + 8, verbose=False)
    # the plan's own request, timed the plan's way, on the runtime the user would load
    prompt, nxt = reference_tokens(int(llm.n_vocab()), prompt_tokens, decode_tokens)
    prefill: list[float] = []
    decode: list[float] = []
    for r in range(rounds + 1):
        pre, dec = time_request(llm, prompt, nxt)
        if r:
            prefill.append(pre)
            decode.append(dec)
    threads = int(llm.context_params.n_threads)
    llm.close()
    return {"n_gpu_layers": n_gpu_layers, "n_threads": threads, "rounds": rounds,
            "prefill_ms_per_token": round(statistics.median(prefill), 4),
            "decode_ms_per_token": round(statistics.median(decode), 4),
            "decode_tokens_per_s": round(1e3 / statistics.median(decode), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    settings = [-1, 0] if gpu else [0]
    runs = [measure(a.model, n, a.prompt_tokens, a.decode_tokens, a.rounds) for n in settings]
    print(json.dumps({"model": a.model, "llama_cpp": llama_cpp.__version__, "gpu_offload": gpu,
                      "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
