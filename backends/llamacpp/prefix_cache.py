"""Prompt KV state kept across conversations (``[backends.llamacpp] prefix_cache_entries``).

llama.cpp's one context keeps the KV state of the last prompt only: a second conversation
evicts the first, and every switch between them reads the whole system prompt again. This
cache keeps the KV state of the last ``prefix_cache_entries`` token sequences of a model
(llama.cpp's per-sequence state, ``llama_state_seq_get_data``), up to ``prefix_cache_bytes``,
least recently used first out. Before a generation, the entry sharing the longest token prefix
with its prompt is restored into the sequence when it beats what the context already holds;
llama-cpp-python's own prefix match then evaluates only the rest.

A context is kept lazily: just before it would be overwritten (a prompt that shares less with
it than it holds), and when the model is closed. With ``prefix_cache_spill`` entries pushed out
of memory, and every entry at close, are written to ``<dir>/<identity>-<tokens>.kv`` and found
again after a restart. Each file carries the identity of what made it (the model file's
sha256, the llama-cpp-python version, the KV cache types, flash attention; each entry its LoRA
adapter's name and digest): a file of another model, runtime version or setting is ignored,
never handed to llama.cpp. State computed under one adapter matches only requests for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"EPKV1\n"
SUFFIX = ".kv"


@dataclass(eq=False)
class KvEntry:
    """The KV state of ``tokens`` in one sequence: in memory (``data``), on disk (``path``)
    or both."""

    tokens: np.ndarray          # int32
    nbytes: int
    data: Any = None            # a ctypes byte array, None while only on disk
    path: Path | None = None
    adapter: str = ""           # the LoRA adapter it was computed under ("" = none)

    @property
    def key(self) -> bytes:
        return _key(self.tokens, self.adapter)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def identity_of(*, model_sha256: str, llama_cpp_version: str, type_k: str, type_v: str,
                flash_attn: bool) -> dict[str, str]:
    """What a spilled KV state is only valid for (plain strings, compared as a whole; the
    adapter is per entry)."""
    return {"model_sha256": model_sha256, "llama_cpp": llama_cpp_version, "type_k": type_k,
            "type_v": type_v, "flash_attn": str(bool(flash_attn))}


class PrefixCache:
    """The kept KV states of one model's sequences; every method runs on the llama.cpp thread
    (the one that owns the context), except the disk writes it starts itself."""

    def __init__(self, *, max_entries: int, max_bytes: int, min_tokens: int,
                 spill_dir: Path | None = None, identity: dict[str, str] | None = None,
                 spill_bytes: int = 1 << 30) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.min_tokens = max(1, min_tokens)
        self.spill_dir = spill_dir
        self.spill_bytes = spill_bytes
        self.identity = identity or {}
        self._tag = hashlib.sha256(json.dumps(self.identity, sort_keys=True).encode()
                                   ).hexdigest()[:16]
        self._mem: OrderedDict[bytes, KvEntry] = OrderedDict()   # least recently used first
        self._disk: dict[bytes, KvEntry] = {}
        self._writes: list[threading.Thread] = []
        self.dirty = False      # the context holds tokens no entry has
        self.adapter = ""       # the adapter the context computes under: entries match only it
        # counters for status and tests
        self.hits = 0
        self.saved = 0
        self.ignored_files = 0
        if spill_dir is not None:
            self._scan()

    # ---- lookup ---------------------------------------------------------------------------
    @property
    def bytes_in_memory(self) -> int:
        return sum(e.nbytes for e in self._mem.values())

    def __len__(self) -> int:
        return len(self._mem.keys() | self._disk.keys())

    def best(self, tokens: np.ndarray) -> tuple[KvEntry | None, int]:
        """The entry sharing the longest prefix with ``tokens``, and that length."""
        found: KvEntry | None = None
        length = 0
        for entry in [*self._mem.values(), *self._disk.values()]:
            if entry.adapter != self.adapter:
                continue
            n = common_prefix(entry.tokens, tokens)
            if n > length or (n == length and found is not None and entry.data is not None
                              and found.data is None):
                found, length = entry, n
        return found, length

    # ---- the llama.cpp side -----------------------------------------------------------------
    def before(self, llm: Any, prompt: list[int]) -> None:
        """Before ``llm`` (a llama-cpp-python ``Llama`` on one sequence) evaluates ``prompt``:
        keep what the context holds if the prompt would overwrite it, and restore the kept
        state sharing more of the prompt than the context does."""
        tokens = np.asarray(prompt, dtype=np.int32)
        held = int(llm.n_tokens)
        current = common_prefix(np.asarray(llm._input_ids, dtype=np.int32), tokens) if held else 0
        if current < held:
            self.keep(llm)
        entry, n = self.best(tokens)
        if entry is None or n <= current or n < self.min_tokens:
            return
        try:
            self._restore(llm, entry)
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("prefix cache: could not restore %d tokens (%s); reading the prompt",
                        len(entry.tokens), exc)
            self._drop(entry)
            llm.reset()
            return
        self.hits += 1

    def keep(self, llm: Any) -> None:
        """Keep the KV state the context holds (once: nothing happens until it changes)."""
        if not self.dirty:
            return
        self.dirty = False
        tokens = np.asarray(llm._input_ids, dtype=np.int32).copy()
        if len(tokens) < self.min_tokens or self.max_entries <= 0:
            return
        key = _key(tokens, self.adapter)
        if key in self._mem:
            self._mem.move_to_end(key)
            return
        llama_cpp = _llama_cpp()
        ctx = llm._ctx.ctx
        llm._ctx.kv_cache_seq_rm(-1, len(tokens), -1)  # cells past n_tokens are never read
        size = int(llama_cpp.llama_state_seq_get_size(ctx, 0))
        if size <= 0 or size > self.max_bytes:
            return
        buf = (ctypes.c_uint8 * size)()
        n = int(llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0))
        if n <= 0:
            return
        entry = KvEntry(tokens, n, buf, adapter=self.adapter)
        # an entry whose tokens begin this one's can never match better: this one replaces it
        for other in [e for e in self._mem.values()
                      if e.adapter == self.adapter and _starts(tokens, e.tokens)]:
            self._mem.pop(other.key, None)
        self._mem[key] = entry
        self.saved += 1
        self._fit()

    def _restore(self, llm: Any, entry: KvEntry) -> None:
        data = entry.data if entry.data is not None else self._read(entry)
        llama_cpp = _llama_cpp()
        if int(llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, data, entry.nbytes, 0)) == 0:
            raise RuntimeError("llama.cpp refused the saved state")
        n = len(entry.tokens)
        llm.input_ids[:n] = entry.tokens
        llm.n_tokens = n
        llm._requires_eval = True  # the logits are not restored: the last token is read again
        key = entry.key
        if key in self._mem:
            self._mem.move_to_end(key)
        elif entry.data is None and self.max_entries > 0:
            entry.data = data   # back in memory: the disk copy stays
            self._mem[key] = entry
            self._fit()

    def _drop(self, entry: KvEntry) -> None:
        key = entry.key
        self._mem.pop(key, None)
        if self._disk.pop(key, None) is not None and entry.path is not None:
            with contextlib.suppress(OSError):
                entry.path.unlink()

    def _fit(self) -> None:
        """Least recently used out until the count and the bytes fit (spilled if on)."""
        while self._mem and (len(self._mem) > self.max_entries
                             or self.bytes_in_memory > self.max_bytes):
            _, entry = self._mem.popitem(last=False)
            self._spill(entry)
            entry.data = None

    # ---- disk ---------------------------------------------------------------------------------
    def close(self, llm: Any | None = None) -> None:
        """Keep the context's state and write every entry to disk (spill on); wait for it."""
        if llm is not None:
            with contextlib.suppress(Exception):  # a closing model must close anyway
                self.keep(llm)
        for entry in list(self._mem.values()):
            self._spill(entry)
        for t in self._writes:
            t.join()
        self._writes.clear()
        self._mem.clear()

    def _spill(self, entry: KvEntry) -> None:
        if self.spill_dir is None or entry.data is None:
            return
        key = entry.key
        if key in self._disk:
            return
        path = self.spill_dir / f"{self._tag}-{hashlib.sha256(key).hexdigest()[:24]}{SUFFIX}"
        entry.path = path
        self._disk[key] = entry
        data = bytes(entry.data)  # the memory copy may be evicted meanwhile
        t = threading.Thread(target=self._write, args=(path, entry.tokens, entry.adapter, data),
                             name="kv-spill", daemon=True)
        self._writes = [w for w in self._writes if w.is_alive()] + [t]
        t.start()

    def _write(self, path: Path, tokens: np.ndarray, adapter: str, data: bytes) -> None:
        header = json.dumps({"identity": self.identity, "n_tokens": len(tokens),
                             "nbytes": len(data), "adapter": adapter}).encode()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as fh:
                fh.write(MAGIC + struct.pack("<I", len(header)) + header)
                fh.write(tokens.astype("<i4").tobytes())
                fh.write(data)
            os.replace(tmp, path)
            # older files from this directory out until it fits the disk budget
            files = sorted(self.spill_dir.glob(f"*{SUFFIX}"),  # type: ignore[union-attr]
                           key=lambda p: p.stat().st_mtime)
            total = sum(p.stat().st_size for p in files)
            for p in files:
                if total <= self.spill_bytes or p == path:
                    break
                total -= p.stat().st_size
                p.unlink()
        except OSError as exc:
            log.warning("prefix cache: could not write %s (%s)", path, exc)

    def _scan(self) -> None:
        """Index the spilled files made with this identity (others are ignored)."""
        assert self.spill_dir is not None
        if not self.spill_dir.is_dir():
            return
        for path in sorted(self.spill_dir.glob(f"*{SUFFIX}")):
            try:
                head, tokens = _read_head(path)
            except (OSError, ValueError) as exc:
                log.info("prefix cache: %s is not a KV file (%s); ignored", path.name, exc)
                self.ignored_files += 1
                continue
            if head.get("identity") != self.identity:
                self.ignored_files += 1
                continue
            entry = KvEntry(tokens, int(head["nbytes"]), None, path, str(head.get("adapter", "")))
            self._disk[entry.key] = entry

    def _read(self, entry: KvEntry) -> Any:
        assert entry.path is not None
        head, tokens = _read_head(entry.path)
        if head.get("identity") != self.identity or not np.array_equal(tokens, entry.tokens):
            raise ValueError(f"{entry.path.name} changed since it was indexed")
        with open(entry.path, "rb") as fh:
            fh.seek(_data_offset(entry.path))
            raw = fh.read()
        if len(raw) != entry.nbytes:
            raise ValueError(f"{entry.path.name} is truncated")
        return (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw)


def _key(tokens: np.ndarray, adapter: str) -> bytes:
    return adapter.encode() + b"\0" + tokens.tobytes()


def _starts(tokens: np.ndarray, prefix: np.ndarray) -> bool:
    return len(prefix) <= len(tokens) and bool(np.array_equal(tokens[:len(prefix)], prefix))


def _read_head(path: Path) -> tuple[dict[str, Any], np.ndarray]:
    with open(path, "rb") as fh:
        if fh.read(len(MAGIC)) != MAGIC:
            raise ValueError("no KV header")
        (n,) = struct.unpack("<I", fh.read(4))
        head = json.loads(fh.read(n))
        tokens = np.frombuffer(fh.read(4 * int(head["n_tokens"])), dtype="<i4")
    return head, tokens.astype(np.int32)


def _data_offset(path: Path) -> int:
    with open(path, "rb") as fh:
        fh.seek(len(MAGIC))
        (n,) = struct.unpack("<I", fh.read(4))
        head = json.loads(fh.read(n))
    return len(MAGIC) + 4 + n + 4 * int(head["n_tokens"])


def _llama_cpp() -> Any:
    import llama_cpp
    return llama_cpp
