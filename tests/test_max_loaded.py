"""``[serving] max_loaded_models`` through HTTP: two generated tiny GGUFs, at most one
resident; a request for the other unloads the idle one (Ollama's ``/api/ps`` and
``/v1/models`` say which is loaded)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest
from daemon_proc import DaemonProcess
from models_fixtures import gguf_path, module_tmp, start_daemon  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def daemon(module_tmp: Path, gguf_path: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    for name in ("one", "two"):
        shutil.copy(gguf_path, models / f"{name}.gguf")
    d = start_daemon(module_tmp, "[serving]\nmax_loaded_models = 1\n"
                                 "[backends.llamacpp]\nn_ctx = 128\n"
                                 '[[models]]\nname = "one"\nfile = "one.gguf"\n'
                                 '[[models]]\nname = "two"\nfile = "two.gguf"\n'
                                 "load_at_start = false\n")
    yield d
    assert d.stop() == 0


def test_a_load_past_the_limit_unloads_the_idle_model(daemon: DaemonProcess) -> None:
    client = ollama.Client(host=daemon.url)
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)

    def loaded() -> list[str]:
        # Ollama lists names with their tag, OpenAI's ids are the configured names
        ps = [(m.model or "").removesuffix(":latest") for m in client.ps().models]
        listed = sorted(m.id for m in oa.models.list().data
                        if (m.model_extra or {}).get("loaded"))
        assert listed == sorted(ps), (listed, ps)
        return ps

    assert loaded() == ["one"]  # the preloaded one
    got = client.generate(model="two", prompt="edge", options={"num_predict": 2})
    assert got.done and got.load_duration
    assert loaded() == ["two"]
    chat = oa.chat.completions.create(model="one", max_tokens=2,
                                      messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.role == "assistant"
    assert loaded() == ["one"]
