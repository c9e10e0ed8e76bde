"""llama.cpp through llama-cpp-python: GGUF models, chat templates from the file.

Segments: llama.cpp cannot hand activations between runtimes, so a GGUF "segment" is a range of
transformer blocks and the only split it can execute is the one llama.cpp does itself — the
*last* ``n_gpu_layers`` blocks on the GPU, the rest on the CPU. A plan for a GGUF model is
therefore that count: a ``gpu`` target supports a segment only when it runs to the last block,
and :func:`n_gpu_layers_for` turns the GPU segment into llama.cpp's parameter.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from pathlib import Path
from typing import Any

from edgepilot.backends.base import Backend, Executable, Segment, Support, Target
from edgepilot.backends.llamacpp.adapters import LoraSet
from edgepilot.backends.llamacpp.draft_model import DraftContext
from edgepilot.backends.llamacpp.executable import LlamaExecutable, TokenStream
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.backends.llamacpp.parallel import LlamaBatchExecutable
from edgepilot.backends.llamacpp.prefix_cache import PrefixCache, identity_of
from edgepilot.backends.llamacpp.proxy import Emit, LlamaWorkerExecutable
from edgepilot.backends.llamacpp.runtime import (
    LLAMA_THREAD,
    LlamaThread,
    ThreadGovernor,
    counting_llama,
    import_llama_cpp,
    refused_as_bad_request,
    usage_of,
)
from edgepilot.backends.llamacpp.spare import SparePool
from edgepilot.errors import BackendError, EdgepilotError
from edgepilot.formats.files import sha256_of
from edgepilot.formats.gguf_info import GgufInfo, read_gguf_info
from edgepilot.formats.gguf_vocab import check_same_vocab

# the pieces live in runtime/executable/batch/parallel; this is the backend's public face
__all__ = ["LLAMA_THREAD", "NATIVE", "LlamaBatchExecutable", "LlamaCppBackend", "LlamaExecutable",
           "LlamaThread", "LlamaWorkerExecutable", "ThreadGovernor", "TokenStream",
           "n_gpu_layers_for",
           "refused_as_bad_request", "usage_of"]

log = logging.getLogger(__name__)

# the file's own GGUF types; the dispatcher never re-quantizes a GGUF
NATIVE = "native"


def n_gpu_layers_for(segment_layers: tuple[int, int] | None, n_layers: int) -> int:
    """llama.cpp's ``n_gpu_layers`` for a GPU segment covering blocks ``[a, b)``.

    llama.cpp offloads the last N blocks, so only suffixes can be placed: ``b`` must be
    ``n_layers``; N = ``n_layers - a``. ``None`` (the whole model) means every block.
    """
    if segment_layers is None:
        return n_layers
    a, b = segment_layers
    if not 0 <= a < b <= n_layers:
        raise BackendError(f"GGUF segment layers [{a}, {b}) outside 0..{n_layers}",
                           field="segment.layers")
    if b != n_layers:
        raise BackendError(
            f"llama.cpp offloads only the last blocks to the GPU; segment [{a}, {b}) must end "
            f"at block {n_layers}", field="segment.layers")
    return n_layers - a


class LlamaCppBackend(Backend):
    """GGUF on llama.cpp; devices ``cpu`` and (GPU builds) ``gpu``; precision = the file's."""

    name = "llamacpp"
    options_class = LlamacppSection
    settings: LlamacppSection

    def __init__(self, settings: LlamacppSection | None = None) -> None:
        self.settings = settings or LlamacppSection()
        # a worker process waiting for the next GGUF load (isolation = "process")
        self.spares = SparePool()

    def start_spares(self) -> None:
        """Keep one spare worker process (``spare_worker``, ``isolation = "process"``): the
        next load skips starting the interpreter and importing llama-cpp-python."""
        if self.isolation == "process" and self.settings.spare_worker and \
                importlib.util.find_spec("llama_cpp") is not None:
            self.spares.start()

    def close_spares(self) -> None:
        self.spares.close()

    def version(self) -> str | None:
        return str(import_llama_cpp().__version__)

    def gpu_offload(self) -> bool:
        return bool(import_llama_cpp().llama_supports_gpu_offload())

    def probe(self) -> list[Target]:
        import_llama_cpp()
        targets = [Target(self.name, "cpu", NATIVE)]
        if self.gpu_offload():
            targets.append(Target(self.name, "gpu", NATIVE))
        return targets

    def supports(self, segment: Segment, target: Target) -> Support:
        if segment.kind != "gguf":
            return Support(False, f"llama.cpp runs GGUF files, not {segment.kind}")
        if target.device not in ("cpu", "gpu"):
            return Support(False, f"llama.cpp devices are cpu and gpu, not {target.device!r}")
        if target.device == "gpu" and not self.gpu_offload():
            return Support(False, "this llama-cpp-python build has no GPU offload")
        info = read_gguf_info(segment.model_path)
        if target.precision not in (NATIVE, info.weight_type):
            return Support(False, f"GGUF weights are {info.weight_type}; llama.cpp does not "
                                  f"re-quantize to {target.precision}")
        if target.device == "gpu":
            try:
                n_gpu_layers_for(segment.layers, info.n_layers)
            except BackendError as exc:
                return Support(False, exc.message)
        return Support(True)

    def compile(self, segment: Segment, target: Target) -> Executable:
        support = self.supports(segment, target)
        if not support:
            raise BackendError(f"{target} cannot run {segment.model_path.name}: {support.reason}")
        info = read_gguf_info(segment.model_path)
        n_gpu = n_gpu_layers_for(segment.layers, info.n_layers) if target.device == "gpu" else 0
        return self.open(segment.model_path, n_gpu_layers=n_gpu, info=info)

    def kv_type_ids(self) -> tuple[int, int]:
        llama_cpp = import_llama_cpp()
        ids = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16,
               "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}
        kv = self.settings.kv_cache_type
        if kv in ("q8_0", "q4_0") and not self.settings.flash_attn:
            # llama.cpp refuses a quantized V cache without flash attention; say so up front
            raise BackendError(f"kv_cache_type = {kv!r} needs flash_attn = true "
                               "([backends.llamacpp])", field="backends.llamacpp.kv_cache_type")
        return ids[kv], ids[kv]

    def open(self, path: Path, *, n_ctx: int | None = None, n_gpu_layers: int | None = None,
             info: GgufInfo | None = None, parallel: int | None = None,
             adapters: dict[str, Path] | None = None, draft: bool = True) -> LlamaExecutable:
        """Load ``path`` with the configured options (``n_ctx``/``n_gpu_layers``/``parallel``
        override). ``parallel`` > 1: a :class:`LlamaBatchExecutable` that serves that many
        generations at once, each with ``n_ctx / parallel`` of the context. ``adapters``:
        LoRA adapter files by name, checked against the model and loaded once (one that does
        not fit is refused with one warning; the model loads without it). ``draft=False``:
        no draft model beside it whatever ``speculative`` says (a load that only times the
        model's own decodes)."""
        llama_cpp = import_llama_cpp()
        s = self.settings
        info = info or read_gguf_info(path)
        ctx = n_ctx or s.n_ctx
        n_gpu = s.n_gpu_layers if n_gpu_layers is None else n_gpu_layers
        n_seq = s.parallel if parallel is None else parallel
        type_k, type_v = self.kv_type_ids()
        started = time.perf_counter()
        try:
            llm = LLAMA_THREAD.call(
                counting_llama(llama_cpp),
                model_path=str(path), n_ctx=ctx, n_gpu_layers=n_gpu,
                n_threads=s.n_threads or os.cpu_count() or 1, use_mmap=s.use_mmap,
                use_mlock=s.use_mlock, flash_attn=s.flash_attn, type_k=type_k, type_v=type_v,
                seed=0, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise BackendError(f"llama.cpp could not load {path.name}: {exc}",
                               field="file") from None
        # llama.cpp's own clock of the model load (mmap, tensors); the rest of Llama() is the
        # context (KV cache, compute buffers)
        llama_ms = (time.perf_counter() - started) * 1e3
        model_ms = float(llama_cpp.llama_perf_context(llm.ctx).t_load_ms)
        split = {"model_ms": round(model_ms, 1), "context_ms": round(llama_ms - model_ms, 1)}
        # one sequence: the batch engine of a parallel model keeps no prefixes across requests
        llm.prefix_cache = self.prefix_cache_for(path) if n_seq == 1 else None
        # the batch engine of a parallel model samples in its own loop: no drafting there
        llm.speculative = s.speculative if n_seq == 1 else "off"
        if llm.speculative == "draft" and not draft:
            llm.speculative = "off"
        if llm.speculative == "draft":
            llm.draft_context, llm.draft_refused = LLAMA_THREAD.call(
                self._open_draft, llama_cpp, path, n_ctx=ctx, n_threads=llm.n_threads,
                all_on_gpu=n_gpu < 0 or n_gpu >= info.n_layers)
        device = "gpu" if n_gpu and self.gpu_offload() else "cpu"
        log.info("llama.cpp loaded %s (ctx %d, n_gpu_layers %d, parallel %d)", path.name, ctx,
                 n_gpu, n_seq)
        target = Target(self.name, device, info.weight_type)
        if n_seq > 1:
            batch = LlamaBatchExecutable(llm, info, target, s.kv_cache_type, n_gpu, n_seq)
            batch.load_split = split
            return batch
        exe = LlamaExecutable(llm, info, target, s.kv_cache_type, n_gpu)
        exe.load_split = split
        if adapters:
            exe.adapters = LLAMA_THREAD.call(LoraSet, llama_cpp, llm._model.model, path,
                                             adapters)
        return exe

    def draft_path(self, path: Path) -> Path | None:
        """The draft GGUF for a model loaded from ``path`` (``speculative = "draft"``; a
        relative ``draft_model`` is taken from the model's directory); None without one."""
        s = self.settings
        if s.speculative != "draft" or s.draft_model is None:
            return None
        draft = s.draft_model.expanduser()
        return draft if draft.is_absolute() else path.parent / draft

    def _open_draft(self, llama_cpp: Any, path: Path, *, n_ctx: int, n_threads: int,
                    all_on_gpu: bool) -> tuple[DraftContext | None, str]:
        # the draft beside the model at ``path``, or None and the one line that refused it
        # (the model serves without drafting)
        draft = self.draft_path(path)
        assert draft is not None
        field = "backends.llamacpp.draft_model"
        type_k, type_v = self.kv_type_ids()
        try:
            if not draft.is_file():
                raise BackendError(f"{field}: draft file {draft} does not exist", field=field)
            check_same_vocab(path, draft, field=field)
            context = DraftContext(llama_cpp, draft, n_ctx=n_ctx, n_threads=n_threads,
                                   n_gpu_layers=-1 if all_on_gpu else 0,
                                   flash_attn=self.settings.flash_attn, type_k=type_k,
                                   type_v=type_v)
        except (EdgepilotError, ValueError, RuntimeError) as exc:
            why = exc.message if isinstance(exc, EdgepilotError) else \
                f"{field}: llama.cpp could not load the draft {draft.name}: {exc}"
            log.warning("%s: draft model refused, serving without drafting: %s", path.name, why)
            return None, why
        log.info("%s: draft model %s loaded (speculative = 'draft')", path.name, draft.name)
        return context, ""

    def prefix_cache_for(self, path: Path) -> PrefixCache | None:
        """The cache of earlier prompts' KV states for a model loaded from ``path`` (None:
        ``prefix_cache_entries = 0``); spilled under ``cache_dir``/kv when asked for."""
        s = self.settings
        if s.prefix_cache_entries <= 0:
            return None
        spill_dir = identity = None
        if s.prefix_cache_spill and self.cache_dir is not None:
            spill_dir = self.cache_dir / "kv"
            identity = identity_of(
                model_sha256=sha256_of(path), llama_cpp_version=str(self.version()),
                type_k=s.kv_cache_type, type_v=s.kv_cache_type, flash_attn=s.flash_attn)
        return PrefixCache(max_entries=s.prefix_cache_entries, max_bytes=s.prefix_cache_bytes,
                           min_tokens=s.prefix_cache_min_tokens, spill_dir=spill_dir,
                           identity=identity, spill_bytes=s.prefix_cache_spill_bytes)

    def open_served(self, path: Path, *, model: str, n_ctx: int | None = None,
                    n_gpu_layers: int | None = None, info: GgufInfo | None = None,
                    emit: Emit | None = None, governor: ThreadGovernor | None = None,
                    adapters: dict[str, Path] | None = None, n_threads: int | None = None
                    ) -> LlamaExecutable | LlamaWorkerExecutable:
        """Load ``path`` to serve requests, where ``[backends.llamacpp] isolation`` says:
        ``"process"`` in a worker process named after ``model`` (``emit`` hears its faults
        and restarts), ``"thread"`` in this process (:meth:`open`). ``governor`` (the GGUF
        plan) sets its thread count per request and hears how fast each decoded. The GGUF
        planner measures with :meth:`open` either way: it times llama.cpp itself, not the
        hand-over. ``n_threads``: the thread count to start with (the plan's; set in the
        worker as it loads, no round trip after)."""
        if self.isolation == "thread":
            exe = self.open(path, n_ctx=n_ctx, n_gpu_layers=n_gpu_layers, info=info,
                            adapters=adapters)
            if n_threads:
                exe.set_threads(n_threads)
            exe.governor = governor
            return exe
        import_llama_cpp()  # a missing llama-cpp-python is BackendUnavailable here, not there
        return LlamaWorkerExecutable(model, path, self.settings, n_ctx=n_ctx,
                                     n_gpu_layers=n_gpu_layers, emit=emit, governor=governor,
                                     cache_dir=self.cache_dir, adapters=adapters, info=info,
                                     spares=self.spares, n_threads=n_threads)
