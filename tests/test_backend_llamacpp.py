"""llama.cpp backend on generated GGUF files: memory estimate, n_gpu_layers plumbing, run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_cpp import Llama
from llama_usage import counts
from models_fixtures import gguf_path  # noqa: F401 - fixture

from edgepilot.backends.base import Segment, Target
from edgepilot.backends.llamacpp.backend import LlamaCppBackend, n_gpu_layers_for
from edgepilot.config import LlamacppSection
from edgepilot.errors import BackendError
from edgepilot.formats.gguf_gen import CHAT_TEMPLATE, GgufSpec, write_gguf
from edgepilot.formats.gguf_info import COMPUTE_OVERHEAD_BYTES, effective_ctx, read_gguf_info

CPU = Target("llamacpp", "cpu", "native")


def whole(path: Path) -> Segment:
    return Segment(path, "gguf", ("tokens",), ("logits",))


@pytest.mark.parametrize("tokenizer", ["spm", "bpe"])
@pytest.mark.parametrize("weights", ["f16", "q8_0", "q4_0"])
def test_generated_gguf_loads_with_its_tokenizer_and_template(
        tmp_path: Path, tokenizer: str, weights: str) -> None:
    path = write_gguf(tmp_path / "m.gguf", GgufSpec(tokenizer=tokenizer,  # type: ignore[arg-type]
                                                    weight_type=weights))  # type: ignore[arg-type]
    info = read_gguf_info(path)
    assert info.weight_type == weights
    assert info.chat_template == CHAT_TEMPLATE
    exe = LlamaCppBackend(LlamacppSection(n_ctx=128)).compile(whole(path), CPU)
    try:
        assert exe.target == Target("llamacpp", "cpu", weights)
        out = exe.chat([{"role": "user", "content": "hello board"}],  # type: ignore[attr-defined]
                       max_tokens=4, temperature=0)
        assert out["usage"]["prompt_tokens"] > 3
        assert out["choices"][0]["message"]["role"] == "assistant"
    finally:
        exe.close()


def test_memory_estimate_is_weights_plus_kv(gguf_path: Path) -> None:  # noqa: F811
    info = read_gguf_info(gguf_path)
    spec = GgufSpec()
    assert (info.n_layers, info.n_kv_heads, info.head_dim) == (
        spec.n_layers, spec.n_kv_heads, spec.n_embd // spec.n_heads)
    kv = 2 * spec.n_layers * 1024 * spec.n_kv_heads * (spec.n_embd // spec.n_heads) * 2
    assert info.kv_bytes(1024, "f16") == kv
    assert info.kv_bytes(1024, "f32") == 2 * kv
    assert info.estimate_bytes(1024) == info.weights_bytes + kv + COMPUTE_OVERHEAD_BYTES
    assert 0 < info.weights_bytes < gguf_path.stat().st_size
    assert info.kv_bytes(100) == info.kv_bytes(256)  # llama.cpp pads ctx to 256 cells


def test_n_gpu_layers_is_the_gpu_suffix() -> None:
    assert n_gpu_layers_for(None, 32) == 32
    assert n_gpu_layers_for((20, 32), 32) == 12
    assert n_gpu_layers_for((0, 32), 32) == 32
    with pytest.raises(BackendError, match="only the last blocks") as err:
        n_gpu_layers_for((0, 16), 32)
    assert err.value.field == "segment.layers"
    with pytest.raises(BackendError, match="outside"):
        n_gpu_layers_for((5, 40), 32)


def test_supports_refuses_what_llamacpp_cannot_do(gguf_path: Path, tmp_path: Path) -> None:  # noqa: F811
    backend = LlamaCppBackend()
    assert backend.probe()[0] == CPU
    assert backend.supports(whole(gguf_path), CPU)
    assert backend.supports(whole(gguf_path), Target("llamacpp", "cpu", "q8_0"))
    no = backend.supports(whole(gguf_path), Target("llamacpp", "cpu", "q4_0"))
    assert not no and "q8_0" in no.reason
    onnx = backend.supports(Segment(tmp_path / "m.onnx", "onnx", ("x",), ("y",)), CPU)
    assert not onnx and "GGUF" in onnx.reason
    if not backend.gpu_offload():  # the CPU wheel: a gpu target is refused with the reason
        gpu = backend.supports(whole(gguf_path), Target("llamacpp", "gpu", "native"))
        assert not gpu and "GPU offload" in gpu.reason


def test_run_matches_llama_logits_and_plumbs_options(gguf_path: Path) -> None:  # noqa: F811
    settings = LlamacppSection(n_ctx=64, n_gpu_layers=2, use_mlock=False)
    exe = LlamaCppBackend(settings).open(gguf_path)
    ref = Llama(str(gguf_path), n_ctx=64, logits_all=True, verbose=False)
    try:
        assert exe.llm.model_params.n_gpu_layers == 2
        assert exe.llm.n_ctx() == effective_ctx(64) == 256
        tokens = ref.tokenize(b"hello edge board")
        out = exe.run({"tokens": np.array(tokens, dtype=np.int32)})["logits"]
        ref.eval(tokens)
        want = np.array(ref.scores[ref.n_tokens - 1])
        assert out.shape == (ref.n_vocab(),)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        with pytest.raises(BackendError, match="tokens"):
            exe.run({"ids": np.array([1], dtype=np.int32)})
        assert exe.memory_bytes == read_gguf_info(gguf_path).estimate_bytes(64)
    finally:
        exe.close()
        ref.close()


def test_quantized_kv_without_flash_attn_is_refused(gguf_path: Path) -> None:  # noqa: F811
    backend = LlamaCppBackend(LlamacppSection(kv_cache_type="q8_0", flash_attn=False))
    with pytest.raises(BackendError, match="flash_attn") as err:
        backend.open(gguf_path)
    assert err.value.field == "backends.llamacpp.kv_cache_type"


def _drain(stream: Any) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in stream:
        choice = chunk["choices"][0]
        text += choice.get("text") or choice.get("delta", {}).get("content") or ""
        finish = choice.get("finish_reason") or finish
    return text, finish


def _firing_stops(text: str, generate: Callable[[str], Any]) -> dict[int, str]:
    """Two-character stop strings cut from ``text`` that do stop generation, by the number of
    completion tokens they stop at (llama-cpp-python matches stops on its own detokenization,
    so not every substring of the final text fires)."""
    stops: dict[int, str] = {}
    for i in range(0, len(text) - 2, 3):
        got = generate(text[i:i + 2])
        if got["choices"][0]["finish_reason"] == "stop":
            stops.setdefault(got["usage"]["completion_tokens"], text[i:i + 2])
    return stops


def test_streamed_usage_equals_llamacpp_with_stop_strings(gguf_path: Path) -> None:  # noqa: F811
    """Stop strings, EOG and length: a stream's usage is what the non-streamed call reports."""
    exe: Any = LlamaCppBackend(LlamacppSection(n_ctx=256)).compile(whole(gguf_path), CPU)
    ref = Llama(str(gguf_path), n_ctx=256, seed=0, verbose=False)
    try:
        prompt = "the edge board is"
        full = ref.create_completion(prompt=prompt, max_tokens=30, temperature=0)
        text = full["choices"][0]["text"]  # type: ignore[index]
        stops = _firing_stops(text, lambda stop: ref.create_completion(
            prompt=prompt, max_tokens=30, temperature=0, stop=[stop]))
        assert len(stops) >= 2, text  # stops ending generation at different tokens
        eos = ref.token_eos()
        cases: list[dict[str, Any]] = [{"stop": [s]} for s in stops.values()]
        cases += [{"logit_bias": {eos: 100.0}},  # the first sample is EOG: not counted
                  {"max_tokens": 5}]
        for extra in cases:
            params = {"max_tokens": 30, "temperature": 0, **extra}
            want = ref.create_completion(prompt=prompt, **params)
            plain = exe.complete(prompt, **params)
            stream = exe.complete(prompt, stream=True, **params)
            streamed_text, finish = _drain(stream)
            if want["usage"]["completion_tokens"] > params["max_tokens"]:  # type: ignore[index]
                # llama-cpp-python ran past max_tokens to finish a character: it holds here
                assert plain["usage"]["completion_tokens"] == params["max_tokens"], extra
                assert stream.usage["completion_tokens"] == params["max_tokens"], extra
                assert want["choices"][0]["text"].startswith(streamed_text)  # type: ignore[index]
                assert finish == "length" and plain["choices"][0]["text"] == streamed_text
                continue
            assert counts(plain["usage"]) == want["usage"], extra
            assert counts(stream.usage) == want["usage"], (extra, streamed_text)  # type: ignore[index]
            assert streamed_text == want["choices"][0]["text"]  # type: ignore[index]
            assert finish == want["choices"][0]["finish_reason"]  # type: ignore[index]
        eog = exe.complete(prompt, stream=True, max_tokens=30, temperature=0,
                           logit_bias={eos: 100.0})
        assert _drain(eog) == ("", "stop")
        assert eog.usage["completion_tokens"] == 0  # sampled once, and that was EOG
        # chat streams go through the same counting
        messages = [{"role": "user", "content": "hello the board"}]
        chat_full = ref.create_chat_completion(messages=messages, max_tokens=20,  # type: ignore[arg-type]
                                               temperature=0)
        content = chat_full["choices"][0]["message"]["content"]  # type: ignore[index]
        chat_stops = _firing_stops(content, lambda stop: ref.create_chat_completion(
            messages=messages, max_tokens=20, temperature=0, stop=[stop]))  # type: ignore[arg-type]
        assert chat_stops, content
        stop = next(iter(chat_stops.values()))
        want_chat = ref.create_chat_completion(messages=messages, max_tokens=20,  # type: ignore[arg-type]
                                               temperature=0, stop=[stop])
        chat_stream = exe.chat(messages, max_tokens=20, temperature=0, stop=[stop], stream=True)
        _drain(chat_stream)
        assert counts(chat_stream.usage) == want_chat["usage"]  # type: ignore[index]
    finally:
        ref.close()
        exe.close()


def test_cancel_ends_a_generation_at_the_next_token(gguf_path: Path) -> None:  # noqa: F811
    """A cancelled request (client gone, shutdown past its drain deadline) stops llama.cpp at
    the next token, streamed or not, even when nothing has been yielded yet."""
    import threading

    from llama_cpp import LogitsProcessorList

    exe: Any = LlamaCppBackend(LlamacppSection(n_ctx=1024)).compile(whole(gguf_path), CPU)

    def cancel_after(n: int) -> tuple[threading.Event, LogitsProcessorList]:
        cancel = threading.Event()
        seen: list[int] = []

        def count(ids: Any, scores: Any) -> Any:  # the "client" leaves after n tokens
            seen.append(1)
            if len(seen) >= n:
                cancel.set()
            return scores
        return cancel, LogitsProcessorList([count])

    cancel, procs = cancel_after(5)
    out = exe.complete("the edge board", max_tokens=900, temperature=0, cancel=cancel,
                       logits_processor=procs)
    assert out["choices"][0]["finish_reason"] == "stop"
    assert len(exe.llm.sampled) == 5  # the 5th token sampled is the end of sequence
    assert exe.llm.sampled[-1] == exe.llm.token_eos()
    cancel, procs = cancel_after(3)
    chunks = list(exe.chat([{"role": "user", "content": "hi"}], max_tokens=900,
                           temperature=0, stream=True, cancel=cancel, logits_processor=procs))
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert len(exe.llm.sampled) == 3
    # the model serves the next request normally
    out = exe.complete("the edge board", max_tokens=3, temperature=0,
                       cancel=threading.Event())
    assert out["usage"]["completion_tokens"] >= 1
    exe.close()
