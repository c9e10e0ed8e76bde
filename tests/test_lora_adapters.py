"""LoRA adapters per request on the real SmolLM2 GGUF, with adapter files written by the
``gguf`` package (no LoRA GGUF ships in a registry package): with an adapter the answer is
llama-cpp-python's own with ``lora_path`` at temperature 0, without it the base's, switching
back and forth on one loaded model; an adapter that does not fit is refused at load with one
line and the base serves on; through the daemon, ``"adapter"`` and ``<model>:<adapter>``."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from daemon_proc import DaemonProcess
from llama_cpp import Llama
from models_fixtures import gguf_path, module_tmp, smollm2_gguf, start_daemon  # noqa: F401

from edgepilot.backends.llamacpp.backend import LlamaCppBackend
from edgepilot.config import LlamacppSection
from edgepilot.errors import CommandError, ModelError
from edgepilot.formats.gguf_lora import check_lora, write_lora

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
N_CTX = 512


def raw_answer(lora: Path | None) -> str:
    """llama-cpp-python's own answer, the adapter loaded its way (``lora_path``)."""
    llm = Llama(str(smollm2_gguf()), n_ctx=N_CTX, n_threads=1, seed=0, verbose=False,
                lora_path=None if lora is None else str(lora))
    try:
        out: Any = llm.create_chat_completion(messages=QUESTION,  # type: ignore[arg-type]
                                              max_tokens=10, temperature=0)
        return str(out["choices"][0]["message"]["content"])
    finally:
        llm.close()


@pytest.fixture(scope="module")
def adapters(module_tmp: Path, gguf_path: Path) -> dict[str, Path]:  # noqa: F811
    return {"extract": write_lora(module_tmp / "extract.gguf", smollm2_gguf(), scale=0.5),
            # written for the small generated model: every shape differs from SmolLM2's
            "bad": write_lora(module_tmp / "bad.gguf", gguf_path)}


@pytest.fixture(scope="module")
def want(adapters: dict[str, Path]) -> dict[str, str]:
    out = {"base": raw_answer(None), "extract": raw_answer(adapters["extract"])}
    assert out["base"] != out["extract"]  # the adapter changes the answer
    return out


def test_adapter_answers_as_llamacpp_with_lora_path_and_base_as_base(
        adapters: dict[str, Path], want: dict[str, str], caplog: pytest.LogCaptureFixture
        ) -> None:
    settings = LlamacppSection(n_ctx=N_CTX, n_threads=1, isolation="thread",
                               prefix_cache_min_tokens=8)
    with caplog.at_level(logging.WARNING, "edgepilot.backends.llamacpp.adapters"):
        exe: Any = LlamaCppBackend(settings).open(smollm2_gguf(), adapters=adapters)
    try:
        # refused at load with one line; the base and the good adapter load
        refusals = [r.getMessage() for r in caplog.records]
        assert len(refusals) == 1 and "bad" in refusals[0] and "does not fit" in refusals[0]
        assert exe.adapters.names() == ["extract"]

        def answer(**kw: Any) -> str:
            return str(exe.chat(QUESTION, max_tokens=10, temperature=0, **kw)
                       ["choices"][0]["message"]["content"])

        # the same prompt under each in turn: KV computed under one is never reused by the other
        assert answer(adapter="extract") == want["extract"]
        assert answer() == want["base"]
        assert answer(adapter="extract") == want["extract"]
        stream = exe.chat(QUESTION, max_tokens=10, temperature=0, stream=True, adapter="extract")
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in stream)
        assert text == want["extract"]
        assert answer() == want["base"]
        with pytest.raises(CommandError, match=r"refused at load.*does not fit") as err:
            answer(adapter="bad")
        assert err.value.field == "adapter"
        with pytest.raises(CommandError, match="unknown adapter 'nope'; this model has: extract"):
            answer(adapter="nope")
        assert answer() == want["base"]
    finally:
        exe.close()


def test_an_adapter_llama_cpp_would_crash_on_is_refused_from_its_header(tmp_path: Path) -> None:
    import gguf

    # F64 tensors: llama.cpp loads them, then crashes in the first matmul (no CPU kernel)
    path = tmp_path / "f64.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 8.0)
    w.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((8, 576)))
    w.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((576, 8)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match=r"f64.gguf does not fit .*is f64; allowed: f32"):
        check_lora(smollm2_gguf(), path)
    with pytest.raises(ModelError, match="not a LoRA adapter"):
        check_lora(smollm2_gguf(), smollm2_gguf())


@pytest.fixture(scope="module")
def daemon(module_tmp: Path, adapters: dict[str, Path]) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    shutil.copy(smollm2_gguf(), models / "smol.gguf")
    for path in adapters.values():
        shutil.copy(path, models / path.name)
    d = start_daemon(module_tmp, "[dispatch]\nenabled = false\n"
                                 "[backends.llamacpp]\nn_ctx = 512\nn_threads = 1\n"
                                 "[[models]]\nname = \"smol\"\nfile = \"smol.gguf\"\n"
                                 "adapters = { extract = \"extract.gguf\", bad = \"bad.gguf\" }\n")
    yield d
    assert d.stop() == 0


def test_daemon_serves_adapters_by_field_and_by_model_name(
        daemon: DaemonProcess, want: dict[str, str]) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="none")

    def ask(model: str, **extra: Any) -> str:
        out = client.chat.completions.create(model=model, messages=QUESTION,  # type: ignore[arg-type]
                                             max_tokens=10, temperature=0, **extra)
        return str(out.choices[0].message.content)

    assert ask("smol:extract") == want["extract"]
    assert ask("smol") == want["base"]
    assert ask("smol", extra_body={"adapter": "extract"}) == want["extract"]
    with pytest.raises(openai.BadRequestError, match="does not fit"):
        ask("smol:bad")
    with pytest.raises(openai.NotFoundError):
        ask("smol:nope")  # not an adapter of smol: an unknown model name
    assert ask("smol") == want["base"]
