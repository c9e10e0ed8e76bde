"""The ``[backends.llamacpp]`` config section, kept beside the backend that reads it.

The backend imports only this model, so it never reaches up into the daemon's config;
edgepilot.config composes it into ``[backends]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from edgepilot.backends.options import BackendOptions, Isolation


class LlamacppSection(BackendOptions):
    """``[backends.llamacpp]``: unknown keys are errors, values are validated on set."""

    n_ctx: int = Field(2048, ge=16, le=1 << 20, description="Default context length.")
    n_threads: int = Field(0, ge=0, le=256, description="0 = number of cores.")
    n_gpu_layers: int = Field(0, ge=-1, le=10_000, description="-1 = all layers on the GPU.")
    use_mmap: bool = Field(True, description="Memory-map weights.")
    use_mlock: bool = Field(False, description="Lock weights in RAM.")
    flash_attn: bool = Field(False, description="Use flash attention when the build has it.")
    kv_cache_type: Literal["f16", "f32", "q8_0", "q4_0"] = Field(
        "f16", description="KV cache element type.")
    parallel: int = Field(
        1, ge=1, le=64,
        description="Chats one model generates at once, as sequences of one llama.cpp context "
                    "(continuous batching), each with n_ctx / parallel tokens of it (llama.cpp "
                    "rounds each share up to a multiple of 256); 1 = one request at a time.")
    prefix_cache_entries: int = Field(
        4, ge=0, le=1024,
        description="KV states of this many earlier prompts kept per model (0 = off): a "
                    "prompt sharing its beginning with one (a long system prompt of another "
                    "conversation) reads only the rest. Matched by the longest common token "
                    "prefix, least recently used first out.")
    prefix_cache_bytes: int = Field(
        128 << 20, ge=0,
        description="Memory the kept KV states of one model may take, in bytes.")
    prefix_cache_min_tokens: int = Field(
        128, ge=1, description="Prompts shorter than this many tokens are not kept.")
    prefix_cache_spill: bool = Field(
        False,
        description="Write kept KV states to <state dir>/cache/llamacpp/kv (those pushed out "
                    "of memory, and all at unload), so they survive a restart of the daemon "
                    "or the worker; a file made by another model file, llama-cpp-python "
                    "version or KV setting is ignored.")
    prefix_cache_spill_bytes: int = Field(
        1 << 30, ge=0, description="Disk the spilled KV states may take, oldest out first.")
    hang_timeout_s: float = Field(
        120.0, ge=0, le=86_400,
        description="A worker with requests in flight that makes no decode step for this long "
                    "(or 50 x its slowest time per token x the tokens under way, if longer) is "
                    "hung: killed and "
                    "restarted, its requests fail naming the hang (isolation = 'process'; "
                    "0 = never).")
    spare_worker: bool = Field(
        True,
        description="Keep one worker process started ahead of need (isolation = 'process'; "
                    "started once the daemon is ready and again after each load that took "
                    "it), so a GGUF load or a worker restart skips starting the interpreter "
                    "and importing llama-cpp-python. ps shows it as "
                    "`edgepilot worker llamacpp (spare)`.")
    speculative: Literal["off", "prompt_lookup", "draft"] = Field(
        "off",
        description="Speculative decoding (experimental, parallel = 1 only): 'off'; "
                    "'prompt_lookup': greedy requests (temperature 0) draft tokens copied from "
                    "their own prompt and output; 'draft': a second, smaller GGUF of the same "
                    "vocabulary (draft_model) drafts them greedily in a context of its own. "
                    "Either way the model verifies the drafts in one batch, and a request "
                    "whose drafts are mostly rejected, or cost more than they save, stops "
                    "drafting. usage.completion_tokens_details counts the drafted tokens taken "
                    "and rejected. Needs flash_attn = true; answers equal the plain path's "
                    "with 1 thread (with more, long contexts can differ at a near tie). "
                    "Figures: bench/README.md.")
    draft_model: Path | None = Field(
        None, validate_default=True,
        description="speculative = 'draft': the draft GGUF, absolute or relative to the "
                    "directory of the model it drafts for. It must have the model's token "
                    "table (size and every token's text); one that does not is refused at "
                    "load with one line, and the model serves without drafting. Loaded beside "
                    "each GGUF model, with its n_ctx and thread count; its weights and KV "
                    "cache count in the model's memory estimate.")

    @field_validator("speculative")
    @classmethod
    def _speculative_needs_flash_attn(cls, value: str, info: ValidationInfo) -> str:
        # without flash attention llama.cpp's CPU attention gives a token decoded in a batch
        # other logits (up to 0.9 apart, measured) than the same token decoded alone, so
        # drafts would change greedy answers; with it they are equal (bench/README.md)
        if value != "off" and not info.data.get("flash_attn"):
            raise ValueError(f"{value!r} needs flash_attn = true (without flash attention "
                             "a batched decode gives other logits than single-token decodes, "
                             "and the answers would change); allowed: 'off', 'prompt_lookup', "
                             "'draft'")
        return value

    @field_validator("draft_model")
    @classmethod
    def _draft_needs_a_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None and info.data.get("speculative") == "draft":
            raise ValueError("speculative = 'draft' needs draft_model, the draft GGUF file (a "
                             "smaller model of the same vocabulary)")
        return value

    isolation: Isolation = Field(
        "process",
        description="Where a served GGUF runs: 'process' = in a worker process "
                    "(`edgepilot worker llamacpp <model>`), so a crash in llama.cpp costs only "
                    "the requests on that model and the worker is restarted; 'thread' = inside "
                    "the daemon on its llama.cpp thread (a native crash takes the daemon).")
