"""What Ollama's ``/api/tags`` and ``/api/show`` say about a GGUF model, from its header.

``digest`` is the ``[[models]] sha256`` when the entry pins one, else a sha256 of the model's
name, file size and modification time (hashing a multi-hundred-megabyte file for a listing
would stall a board): distinct per model, as clients expect (the ``llm-ollama`` plugin groups
models by digest: with every digest empty it served all of them as one); ``size`` is the
file's size.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from edgepilot.errors import ModelError
from edgepilot.formats import files
from edgepilot.formats.gguf_info import read_gguf_info
from edgepilot.serving.generate import Generator
from edgepilot.serving.templates import template_of


def model_details(path: Path, kind: str) -> dict[str, Any]:
    """Ollama's ``details``: format, architecture (family), weight type (quantization)."""
    details: dict[str, Any] = {"parent_model": "", "format": kind, "family": "",
                               "families": None, "parameter_size": "",
                               "quantization_level": ""}
    if kind == "gguf":
        try:
            info = read_gguf_info(path)
        except ModelError:
            return details
        details.update(family=info.arch, families=[info.arch],
                       quantization_level=info.file_type or info.weight_type.upper(),
                       parameter_size=info.size_label)
    return details


def digest_of(name: str, path: Path, pinned: str | None) -> str:
    """The ``digest`` Ollama's listings show for a model (see the module docstring)."""
    if pinned:
        return pinned
    try:
        st = path.stat()
        stamp = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        stamp = "missing"
    return hashlib.sha256(f"{name}\0{path.name}\0{stamp}".encode()).hexdigest()


def _modified(path: Path) -> str:
    try:
        mtime = path.stat().st_mtime
    except OSError:
        mtime = 0.0
    return datetime.fromtimestamp(mtime, UTC).isoformat().replace("+00:00", "Z")


def tagged(name: str) -> str:
    """``name`` as Ollama lists it: with a tag, ``:latest`` when it has none. Clients check a
    model against the listing by its full name (langchain-ollama's ``validate_model_on_init``:
    "Model 'smol:latest' not found ... Available local models: emb, smol")."""
    return name if ":" in name else f"{name}:latest"


def tag_of(gen: Generator, item: dict[str, Any]) -> dict[str, Any]:
    """Blocking (reads headers): one model of ``/api/tags`` from a registry listing item."""
    name = item["name"]
    entry = gen.registry.catalog.entries()[name]
    path = Path(item["file"])
    try:
        path = gen.registry.catalog.resolve(name).path
        size = path.stat().st_size
    except (ModelError, OSError):
        size = 0
    return {"name": tagged(name), "model": tagged(name), "modified_at": _modified(path),
            "size": size,
            "digest": digest_of(name, path, entry.sha256),
            "details": model_details(path, "gguf")}


def show_info(gen: Generator, model: files.ResolvedModel) -> dict[str, Any]:
    """Blocking: ``/api/show``'s answer for a GGUF model."""
    info = read_gguf_info(model.path)
    tpl = template_of(model, gen.registry.config.model_dir)
    lm = gen.registry.loaded.get(model.name)
    n_ctx = model.entry.n_ctx or gen.registry.config.backends.llamacpp.n_ctx
    model_info: dict[str, Any] = {
        "general.architecture": info.arch,
        f"{info.arch}.block_count": info.n_layers,
        f"{info.arch}.embedding_length": info.n_embd,
        f"{info.arch}.attention.head_count": info.n_heads,
        f"{info.arch}.attention.head_count_kv": info.n_kv_heads,
        f"{info.arch}.context_length": info.n_ctx_train,
    }
    # an embedding model (its header names a pooling) is listed as one, as Ollama lists it:
    # front ends offer only such models for embeddings, and not for chat
    capabilities = ["embedding"] if info.pooling else ["completion", "tools"]
    return {
        "modelfile": f"# served by edgepilot from {model.path.name}\nFROM {model.path}\n",
        "parameters": f"num_ctx {n_ctx}",
        "template": tpl.text if tpl.text is not None else info.chat_template or "",
        "chat_template": tpl.describe(),
        "details": model_details(model.path, model.kind),
        "model_info": model_info,
        "capabilities": capabilities,
        "modified_at": _modified(model.path),
        "loaded": lm is not None,
    }
