"""The prefix cache across conversations on the real SmolLM2 GGUF: a conversation interleaved
with another reads only its new tokens, answers exactly as a cold run does, survives a reload
through the spill directory, and a spilled state of another model or runtime version is
ignored, never handed to llama.cpp."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from models_fixtures import gguf_path, smollm2_gguf  # noqa: F401 - fixture

from edgepilot.backends.llamacpp.backend import LlamaCppBackend
from edgepilot.backends.llamacpp.prefix_cache import MAGIC, PrefixCache
from edgepilot.config import LlamacppSection

# two long system prompts (two agents' device lists): each far longer than a user turn
DEVICES_A = "Devices: " + ", ".join(f"lamp {i} in room {i % 7}" for i in range(25))
DEVICES_B = "Sensors: " + ", ".join(f"thermometer {i} on floor {i % 3}" for i in range(25))
N_CTX = 1024


def conversation(system: str, turn: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system}]
    for i in range(turn):
        msgs += [{"role": "user", "content": f"Question {i}: which device is number {i}?"},
                 {"role": "assistant", "content": f"Device {i}."}]
    return [*msgs, {"role": "user", "content": f"Question {turn}: what is on number {turn}?"}]


def settings(**kw: Any) -> LlamacppSection:
    # one thread: a shared CI machine spins OpenMP barriers on two
    return LlamacppSection(n_ctx=N_CTX, n_threads=1, isolation="thread", prefix_cache_min_tokens=32,
                           **kw)


def ask(exe: Any, messages: list[dict[str, str]]) -> tuple[str, int, int]:
    out = exe.chat(messages, max_tokens=8, temperature=0)
    usage = out["usage"]
    return (out["choices"][0]["message"]["content"], usage["prompt_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"])


def cold(messages: list[dict[str, str]]) -> str:
    """The answer of a model that never saw another prompt (no cache, fresh context)."""
    exe: Any = LlamaCppBackend(settings(prefix_cache_entries=0)).open(smollm2_gguf())
    try:
        text, _, cached = ask(exe, messages)
        assert cached == 0
        return text
    finally:
        exe.close()


def test_interleaved_conversations_read_only_new_tokens_and_answer_as_cold() -> None:
    exe: Any = LlamaCppBackend(settings()).open(smollm2_gguf())
    try:
        _, a_prompt, a_cached = ask(exe, conversation(DEVICES_A, 0))
        _, b_prompt, b_cached = ask(exe, conversation(DEVICES_B, 0))
        # (the chat template's first tokens are common to both)
        assert a_cached == 0 and b_cached < 8 and a_prompt > 150
        # back to A: its system prompt comes out of the cache, not from llama.cpp again
        a2 = conversation(DEVICES_A, 1)
        a2_text, _, a2_cached = ask(exe, a2)
        assert a2_cached >= a_prompt - 20, (a2_cached, a_prompt)
        assert exe.llm.prefix_cache.hits == 1
        b2 = conversation(DEVICES_B, 1)
        b2_text, _, b2_cached = ask(exe, b2)
        assert b2_cached >= b_prompt - 20
        assert exe.llm.prefix_cache.hits == 2
    finally:
        exe.close()
    assert a2_text == cold(a2)
    assert b2_text == cold(b2)


def test_spilled_state_survives_a_reload_and_a_foreign_one_is_ignored(
        tmp_path: Path, gguf_path: Path) -> None:  # noqa: F811
    backend = LlamaCppBackend(settings(prefix_cache_spill=True))
    backend.cache_dir = tmp_path
    kv = tmp_path / "kv"
    exe: Any = backend.open(smollm2_gguf())
    try:
        _, a_prompt, _ = ask(exe, conversation(DEVICES_A, 0))
    finally:
        exe.close()  # the context's state is kept and written
    files = list(kv.glob("*.kv"))
    assert len(files) == 1
    a2 = conversation(DEVICES_A, 1)

    # another model file on the same directory: the file is not its own
    other: Any = LlamaCppBackend(settings(prefix_cache_spill=True))
    other.cache_dir = tmp_path
    small: Any = other.open(gguf_path)
    try:
        assert len(small.llm.prefix_cache) == 0 and small.llm.prefix_cache.ignored_files == 1
        small.chat(a2, max_tokens=2, temperature=0)
        assert small.llm.prefix_cache.hits == 0
    finally:
        small.llm.prefix_cache.spill_dir = None  # leave the directory to the first model
        small.close()

    # a reload of the same model: the first turn of the known system prompt is mostly cached
    exe = backend.open(smollm2_gguf())
    try:
        text, _, cached = ask(exe, a2)
        assert cached >= a_prompt - 20
        assert exe.llm.prefix_cache.hits == 1
    finally:
        exe.llm.prefix_cache.spill_dir = None
        exe.close()
    assert text == cold(a2)

    # the same file as another llama-cpp-python version would have written it: ignored
    data = files[0].read_bytes()
    (n,) = struct.unpack("<I", data[len(MAGIC):len(MAGIC) + 4])
    head = json.loads(data[len(MAGIC) + 4:len(MAGIC) + 4 + n])
    head["identity"]["llama_cpp"] = "0.0.1"
    new_head = json.dumps(head).encode()
    files[0].write_bytes(MAGIC + struct.pack("<I", len(new_head)) + new_head
                         + data[len(MAGIC) + 4 + n:])
    exe = backend.open(smollm2_gguf())
    try:
        cache: PrefixCache = exe.llm.prefix_cache
        assert len(cache) == 0 and cache.ignored_files == 1
        text, _, cached = ask(exe, a2)
        assert cached == 0 and cache.hits == 0
    finally:
        exe.llm.prefix_cache.spill_dir = None
        exe.close()
    assert text == cold(a2)
