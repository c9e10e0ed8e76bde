"""Embeddings from an ONNX/TFLite text encoder (a sentence-transformers export such as
all-MiniLM-L6-v2) for ``/v1/embeddings`` and ``/api/embed``.

The model's files sit as sentence-transformers lays them out, in the model file's directory
(or its parent, for an ``onnx/model.onnx`` export):

- ``tokenizer.json``: the Hugging Face tokenizer (read with the ``tokenizers`` package), with its
  own truncation and padding; without padding in it, texts are padded to the next power of two
  (at least 16 tokens), so that a few input shapes, each planned once, serve every text;
- ``modules.json``: the pipeline: its ``Pooling`` module's ``config.json`` says how token vectors
  become one (``pooling_mode_cls_token``, ``_mean_tokens``, ``_max_tokens``,
  ``_mean_sqrt_len_tokens``) and a ``Normalize`` module L2-normalises the result. Without
  ``modules.json``: mean pooling, normalised (what the embedding routes return for GGUF).

Each text runs as one request through :meth:`~edgepilot.serving.core.Serving.infer`, i.e. on
the dispatcher's plan for its input shape (whole on the default target while that plan is
made), in the device's line, with its work and energy recorded. The encoder's token output is
its first output of rank 3 (``last_hidden_state``, ``token_embeddings``); a model whose only
outputs are already pooled (rank 2) is normalised as said and not pooled again.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgepilot.errors import CommandError, ModelError
from edgepilot.formats.files import ResolvedModel
from edgepilot.formats.io import tensor_specs
from edgepilot.serving.core import Serving

POOLINGS = ("cls", "mean", "max", "mean_sqrt_len")


@dataclass(frozen=True)
class EncoderConfig:
    """How a text encoder's token vectors become one embedding."""

    tokenizer: Path
    pooling: str = "mean"
    normalize: bool = True


def _beside(model: Path, name: str) -> Path | None:
    for folder in (model.parent, model.parent.parent):
        if (folder / name).is_file():
            return folder / name
    return None


def encoder_config(model: Path) -> EncoderConfig | None:
    """Blocking: the encoder files beside ``model``; None when there is no tokenizer."""
    tokenizer = _beside(model, "tokenizer.json")
    if tokenizer is None:
        return None
    modules_file = _beside(model, "modules.json")
    if modules_file is None:
        return EncoderConfig(tokenizer)
    try:
        modules = json.loads(modules_file.read_text())
        pooling, normalize = "mean", False
        for module in modules:
            kind = str(module.get("type", ""))
            if kind.endswith(".Normalize"):
                normalize = True
            elif kind.endswith(".Pooling"):
                pooling = _pooling(json.loads((modules_file.parent / module["path"]
                                               / "config.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelError(f"{modules_file}: not a sentence-transformers module list ({exc})",
                         field="model") from None
    return EncoderConfig(tokenizer, pooling, normalize)


def _pooling(config: dict[str, Any]) -> str:
    for mode in POOLINGS:
        if config.get(f"pooling_mode_{mode}_token" if mode == "cls" else
                      f"pooling_mode_{mode}_tokens"):
            return mode
    raise ValueError("no pooling mode set; allowed: " + ", ".join(POOLINGS))


def pool(tokens: np.ndarray, mask: np.ndarray, how: str, normalize: bool) -> np.ndarray:
    """One vector from ``tokens`` ([sequence, dim]) over the positions ``mask`` keeps."""
    keep = mask.astype(bool)
    real = tokens[keep].astype(np.float64)
    if how == "cls":
        vec = tokens[0].astype(np.float64)
    elif how == "max":
        vec = real.max(axis=0)
    else:
        vec = real.sum(axis=0) / (len(real) if how == "mean" else np.sqrt(len(real)))
    norm = float(np.linalg.norm(vec))
    return vec / norm if normalize and norm else vec


class TextEncoders:
    """Embeddings of texts from tensor models that carry a tokenizer."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self._lock = threading.Lock()
        self._loaded: dict[tuple[Path, float], tuple[EncoderConfig, Any, list[str], str]] = {}

    def _prepare(self, model: ResolvedModel) -> tuple[EncoderConfig, Any, list[str], str]:
        """Blocking: the model's encoder config, tokenizer, input names and token output."""
        key = (model.path, model.path.stat().st_mtime)
        with self._lock:
            if key in self._loaded:
                return self._loaded[key]
        config = encoder_config(model.path)
        if config is None:
            raise CommandError(f"model {model.name!r} is a {model.kind} tensor model with no "
                               "tokenizer.json beside it; it computes no embeddings (a text "
                               "encoder needs its tokenizer.json, see the README's embeddings)",
                               field="model")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise CommandError("the tokenizers package is not installed (pip install "
                               "tokenizers, or the onnx extra): text encoders need it",
                               field="model") from None
        try:
            tokenizer = Tokenizer.from_file(str(config.tokenizer))
        except Exception as exc:  # the tokenizers package raises plain Exception
            raise ModelError(f"{config.tokenizer}: not a tokenizer file ({exc})",
                             field="model") from None
        ins, outs = tensor_specs(model.path, model.kind)
        ranks = {o.name: len(o.shape) for o in outs}
        tokens = next((n for n, r in ranks.items() if r == 3), None) \
            or next((n for n, r in ranks.items() if r == 2), None)
        if tokens is None or "input_ids" not in [i.name for i in ins]:
            raise CommandError(f"model {model.name!r} is no text encoder (inputs input_ids, "
                               "attention_mask; a [batch, sequence, dim] output)",
                               field="model")
        prepared = (config, tokenizer, [i.name for i in ins], tokens)
        with self._lock:
            self._loaded[key] = prepared
        return prepared

    async def embed(self, name: str, model: ResolvedModel, texts: list[str]
                    ) -> tuple[list[list[float]], int]:
        """One vector per text, and the texts' token count (their real tokens)."""
        config, tokenizer, inputs, output = await self.serving.run_blocking(self._prepare,
                                                                            model)
        vectors, count = [], 0
        for text in texts:
            if not text:
                raise CommandError("an input to embed is empty", field="input")
            enc = tokenizer.encode(text)
            ids = np.asarray(enc.ids, dtype=np.int64)
            mask = np.asarray(enc.attention_mask, dtype=np.int64)
            if tokenizer.padding is None:  # a few shapes, each planned once
                width = max(16, 1 << (len(ids) - 1).bit_length())
                ids = np.pad(ids, (0, width - len(ids)))
                mask = np.pad(mask, (0, width - len(mask)))
            feed = {"input_ids": ids, "attention_mask": mask,
                    "token_type_ids": np.zeros_like(ids)}
            result = await self.serving.infer(
                name, {k: v[None, :] for k, v in feed.items() if k in inputs}, model=model)
            out = np.asarray(result.outputs[output])[0]
            count += int(mask.sum())
            if out.ndim == 1:  # pooled by the model itself
                norm = float(np.linalg.norm(out))
                vec = out / norm if config.normalize and norm else out.astype(np.float64)
            else:
                vec = pool(out, mask, config.pooling, config.normalize)
            vectors.append(vec.astype(float).tolist())
        return vectors, count
