"""A ``[[models]]`` config entry: the file that names a model and how to plan and serve it.

It sits in formats, beside the file resolver that reads it, so formats never imports the
daemon's config; edgepilot.config composes it into ``models`` and re-exports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator


class ModelEntry(BaseModel):
    """One ``[[models]]`` entry: unknown keys are errors, values are validated on set."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$",
                      description="Name used in APIs.")
    file: Path = Field(description="File, relative to the model dir.")
    kind: Literal["gguf", "onnx", "tflite"] | None = Field(
        None, description="Format (default: from the file extension).")
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$",
                               description="Expected digest, verified before load.")
    tolerance: float | None = Field(None, gt=0, le=1,
                                    description="Output error budget (relative L2) for plans.")
    keep_alive_s: float = Field(300.0, ge=0, le=7 * 86400,
                                description="Idle time before the model is unloaded.")
    n_ctx: int | None = Field(None, ge=16, le=1 << 20, description="GGUF context length.")
    chat_template: Path | None = Field(
        None, description="GGUF: a Jinja chat template file (relative to the model dir) used "
                          "instead of the file's own or the one chosen for its architecture.")
    load_at_start: bool = Field(
        True, validation_alias=AliasChoices("load_at_start", "preload"),
        description="Load when the daemon starts (also spelled preload); false: on the first "
                    "request.")
    input_shapes: dict[str, list[int]] | None = Field(
        None, description="Input shapes to plan for, e.g. { x = [1, 3, 320, 320] } (needed "
        "for inputs with dynamic dims unless the first request sets them); each dim 1..2^24.")
    max_batch: int = Field(1, ge=1, le=1024, description="Concurrent requests coalesced into "
                           "one run along the batch dimension (1: no dynamic batching).")
    # short: while a batch runs, the next one fills anyway; the wait only gathers requests
    # that arrive together at an idle model, and costs a lone request that much latency
    batch_wait_ms: float = Field(0.5, ge=0, le=10_000, description="How long the first "
                                 "request of a batch at an idle model waits for others.")

    adapters: dict[str, Path] = Field(
        default_factory=dict,
        description="GGUF: LoRA adapter files by name, relative to the model dir, e.g. "
        "{ extract = \"extract-lora.gguf\" }; a request picks one with \"adapter\": \"extract\" "
        "or the model name \"<name>:extract\" (llama.cpp, parallel = 1).")

    @field_validator("adapters")
    @classmethod
    def _adapters(cls, value: dict[str, Path]) -> dict[str, Path]:
        for name in value:
            if not name or len(name) > 64 or not all(c.isalnum() or c in "_.-" for c in name):
                raise ValueError(f"adapter name {name!r}: allowed 1-64 of A-Z a-z 0-9 _ . -")
        return value

    @field_validator("input_shapes")
    @classmethod
    def _input_shapes(cls, value: dict[str, list[int]] | None) -> dict[str, list[int]] | None:
        for name, dims in (value or {}).items():
            if len(dims) > 8:
                raise ValueError(f"input {name!r}: {len(dims)} dims; allowed at most 8")
            bad = [d for d in dims if not 1 <= d <= 1 << 24]
            if bad:
                raise ValueError(f"input {name!r}: dim {bad[0]} out of range; allowed 1..16777216")
        return value
