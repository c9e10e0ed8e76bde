"""Parts of ``bench/gguf_bench.py`` kept apart: the parallel part (``gguf_parallel_bench``'s
rounds on a daemon with ``parallel = 4``) and the issue's "done when" rows of one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf_parallel_bench as parallel_bench


def bench_parallel(path: Path, work: Path, rounds: int, max_tokens: int) -> dict[str, Any]:
    """Part 5: a daemon with ``parallel = 4``, four chats at once vs one after another."""
    argv, port, ready = parallel_bench.daemon(work, path, 4, "process")
    with parallel_bench.server(argv, port, ready, work / "parallel.log"):
        return parallel_bench.bench_one(port, "smol", rounds, max_tokens)


def done_when(load: dict[str, Any], decode: dict[str, Any], tech: dict[str, Any],
              par: dict[str, Any]) -> list[str]:
    """The issue's "done when" rows from this run, daemon beside raw llama-cpp-python."""
    it, rs, ad, kv = tech["interleaved"], tech["restart"], tech["adapters"], tech["kv_cache"]
    look = tech["prompt_lookup"]
    return [
        f"interleaved TTFT, later turns: daemon {it['daemon']['later_turns_s']:.3f} s "
        f"(x{it['daemon']['cold_over_later']} faster than cold) | raw "
        f"{it['raw']['later_turns_s']:.3f} s (x{it['raw']['cold_over_later']}) | raw + "
        f"LlamaRAMCache {it['raw_ramcache']['later_turns_s']:.3f} s "
        f"(x{it['raw_ramcache']['cold_over_later']}) [goal >= 10x]",
        f"restart TTFT: x{rs['cold_over_after_restart']} faster than cold "
        f"({rs['after_restart_next_turn_s']:.3f} vs {rs['cold_first_turn_s']:.2f} s) | raw: "
        "no such feature [goal >= 5x]",
        f"adapter: identical to llama-cpp-python lora_path {ad['identical_to_llama_cpp_lora_path']}"
        f", base identical {ad['base_identical_to_raw_base']}; switch cost "
        f"{ad['switch_cost_ms']} ms",
        "prompt lookup (plain / lookup, each stack against its own plain path): " + ", ".join(
            f"{task} edgepilot x{look[task]['edgepilot_speedup']} (identical "
            f"{look[task]['edgepilot_identical']}), llama-cpp-python's own "
            f"x{look[task]['raw_lookup_speedup']} (identical {look[task]['raw_identical']})"
            for task in ("copy", "rewrite-300", "chat"))
        + " [goal >= 1.3x on copy, chat >= 0.97x]",
        f"load: daemon/raw x{load['daemon_over_raw']} (plan cached x"
        f"{load['daemon_planned_over_raw']}) [goal <= 1.2]",
        f"parallel=4 aggregate decode, 4 at once / one after another: "
        f"x{par['ratio_decode_tokens_per_s']} (same answers "
        f"{par['same_answers_concurrent_and_alone']}) [goal >= 1.5, ceiling ~1.84]",
        f"streamed decode: daemon/raw x{decode['stream_daemon_over_raw']} (whole request "
        f"x{decode['whole_daemon_over_raw']}) [goal >= 0.97]",
        "KV bytes per context token: " + ", ".join(
            f"{k} {r['kv_bytes_per_token']}" for k, r in kv.items()) + " (raw llama.cpp's state "
        "size; the daemon runs the same context)",
    ]
