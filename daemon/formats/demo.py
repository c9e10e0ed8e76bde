"""Demo models so a fresh install serves something: a tiny GGUF chat model and an ONNX MLP."""

from __future__ import annotations

import logging
from pathlib import Path

from edgepilot.errors import ConfigError
from edgepilot.formats import files
from edgepilot.formats.gguf_gen import GgufSpec, write_gguf
from edgepilot.formats.model_entry import ModelEntry

log = logging.getLogger(__name__)

DEMO_GGUF = "demo-chat.gguf"
DEMO_ONNX = "demo-mlp.onnx"


def model_files(model_dir: Path) -> list[Path]:
    """Model files already in ``model_dir`` (top level)."""
    if not model_dir.is_dir():
        return []
    return [p for p in model_dir.iterdir() if p.suffix.lower() in files.KINDS and p.is_file()]


def ensure_demo_models(model_dir: Path) -> list[ModelEntry]:
    """Generate the demo models when ``model_dir`` holds no model; return entries for them.

    Takes well under a second: the GGUF is a 2-block, 64-wide random llama (Q8_0), the ONNX
    model a small MLP stack from :mod:`edgepilot.formats.onnx_gen`.
    """
    if model_files(model_dir):
        return []
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"model dir {model_dir} cannot be created ({exc.strerror}); point "
                          "--model-dir or [daemon] model_dir at a writable directory",
                          field="daemon.model_dir") from None
    gguf = write_gguf(model_dir / DEMO_GGUF, GgufSpec(n_layers=2, n_embd=64, n_ff=128))
    from edgepilot.formats.onnx_gen import mlp_stack

    onnx_path = model_dir / DEMO_ONNX
    mlp_stack(onnx_path, widths=(64, 128, 128, 64), batch=1)
    log.info("generated demo models in %s", model_dir)
    return [
        ModelEntry(name="demo-chat", file=Path(gguf.name), kind="gguf",
                   sha256=files.sha256_of(gguf), load_at_start=False),
        ModelEntry(name="demo-mlp", file=Path(onnx_path.name), kind="onnx",
                   sha256=files.sha256_of(onnx_path), load_at_start=False),
    ]
