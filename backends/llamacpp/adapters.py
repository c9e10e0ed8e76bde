"""LoRA adapters of one loaded GGUF (``[[models]] adapters = { name = "file.gguf" }``).

Every adapter is checked against the base model's header first
(:func:`edgepilot.formats.gguf_lora.check_lora`: a mismatch llama.cpp does not foresee crashes
it), then loaded once with ``llama_adapter_lora_init``; one that does not fit is refused with one
WARNING line and the model serves without it (a request for it gets that line back). A request
picks one by name; :meth:`LoraSet.apply` sets it on the context with
``llama_set_adapters_lora`` (llama.cpp applies adapters per context) — the weights stay loaded
once, only the set changes. Everything here runs on the llama.cpp thread.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Any

from edgepilot.errors import BackendError, CommandError, EdgepilotError
from edgepilot.formats.files import sha256_of
from edgepilot.formats.gguf_lora import check_lora

log = logging.getLogger(__name__)


class LoraSet:
    """The adapters of one model: loaded ones by name, refused ones with their reason."""

    def __init__(self, llama_cpp: Any, model: Any, base: Path, files: dict[str, Path]) -> None:
        self._llama_cpp = llama_cpp
        self.loaded: dict[str, Any] = {}
        self.refused: dict[str, str] = {}
        self.tags: dict[str, str] = {}     # name -> name@sha256 prefix (what KV state was made by)
        self.active = ""                   # "" = the base model alone
        for name, path in files.items():
            try:
                check_lora(base, path, field=f"models.adapters.{name}")
                adapter = llama_cpp.llama_adapter_lora_init(model, str(path).encode())
                if not adapter:
                    raise BackendError(f"llama.cpp could not load LoRA adapter {path.name}",
                                       field=f"models.adapters.{name}")
            except EdgepilotError as exc:
                self.refused[name] = exc.message
                log.warning("adapter %r refused: %s", name, exc.message)
                continue
            self.loaded[name] = adapter
            self.tags[name] = f"{name}@{sha256_of(path)[:16]}"

    def names(self) -> list[str]:
        return sorted(self.loaded)

    def check(self, name: str | None) -> str:
        """``name`` as the adapter a request asks for ("" = none); CommandError naming the
        field and the adapters there are otherwise."""
        if not name:
            return ""
        if name in self.loaded:
            return name
        if name in self.refused:
            raise CommandError(f"adapter {name!r} was refused at load: {self.refused[name]}",
                               field="adapter")
        raise CommandError(f"unknown adapter {name!r}; this model has: "
                           f"{', '.join(self.names()) or 'none'}", field="adapter")

    def tag(self, name: str) -> str:
        """What KV state computed under adapter ``name`` is keyed by ("" = the base)."""
        return self.tags.get(name, "")

    def apply(self, ctx: Any, name: str) -> bool:
        """Set adapter ``name`` ("" = none) on ``ctx``; whether the set changed."""
        if name == self.active:
            return False
        llama_cpp = self._llama_cpp
        if name:
            adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(self.loaded[name])
            scales = (ctypes.c_float * 1)(1.0)
            rc = llama_cpp.llama_set_adapters_lora(ctx, adapters, 1, scales)
        else:
            rc = llama_cpp.llama_set_adapters_lora(ctx, None, 0, None)
        if rc != 0:
            raise BackendError(f"llama.cpp could not set adapter {name or '(none)'!r} "
                                 f"(llama_set_adapters_lora returned {rc})", field="adapter")
        self.active = name
        return True

