"""numpy tensors through POSIX shared memory between the daemon and a tensor worker.

One block per direction per executable, reused from call to call (grown, never shrunk), so a
request costs two copies (into the block, out of it) and no allocation. The side that writes a
block creates and owns it; the other side attaches by name. A description of what a block
holds travels over the worker's connection: ``{"block": name, "tensors": [(name, dtype,
shape, offset), ...], "inline": {name: array}}`` (``inline``: arrays of Python objects, e.g.
strings, which have no flat bytes; they are pickled with the message).

Resource tracking: Python (3.11) registers every block, attached ones too, with the process's
resource tracker, which unlinks them when that process ends. That is right for the creator —
the blocks of a SIGKILLed worker are removed by its tracker — and wrong for the side that only
attaches (a worker killed by the OOM killer would take the daemon's input blocks with it), so
an attachment is unregistered at once.
"""

from __future__ import annotations

import contextlib
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

ALIGN = 64  # each tensor starts on a cache line (and any SIMD load's alignment)
MIN_BLOCK = 4096
Layout = dict[str, Any]


def attach(name: str) -> SharedMemory:
    """Block ``name`` made by the other side, not tracked here (see the module docstring)."""
    shm = SharedMemory(name=name)
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


def close_quietly(shm: SharedMemory) -> None:
    """Unmap ``shm``; a view of it still alive somewhere keeps the mapping (no error)."""
    with contextlib.suppress(BufferError):
        shm.close()


class OwnedBlock:
    """A block this side writes tensors into; replaced by a bigger one when they outgrow it."""

    def __init__(self) -> None:
        self.shm: SharedMemory | None = None

    def write(self, arrays: dict[str, np.ndarray]) -> Layout:
        """Copy ``arrays`` into the block; the layout for the other side to read them."""
        flat: list[tuple[str, np.ndarray]] = []
        inline: dict[str, np.ndarray] = {}
        for name, value in arrays.items():
            arr = np.asarray(value)
            if arr.dtype.hasobject:
                inline[name] = arr
            else:
                flat.append((name, arr))
        tensors = []
        offset = 0
        for name, arr in flat:
            tensors.append((name, arr.dtype.str, tuple(arr.shape), offset))
            offset += -(-arr.nbytes // ALIGN) * ALIGN
        if offset and (self.shm is None or self.shm.size < offset):
            self.release()
            self.shm = SharedMemory(create=True, size=max(MIN_BLOCK, offset * 2))
        if self.shm is not None:
            for (_name, arr), (_, dtype, shape, off) in zip(flat, tensors, strict=True):
                view: np.ndarray = np.ndarray(shape, dtype, buffer=self.shm.buf, offset=off)
                view[...] = arr
                del view
        return {"block": self.shm.name if self.shm is not None and tensors else None,
                "tensors": tensors, "inline": inline}

    @property
    def name(self) -> str | None:
        return self.shm.name if self.shm is not None else None

    def release(self) -> None:
        """Unmap and remove the block (the other side's mapping stays valid until it unmaps)."""
        if self.shm is not None:
            shm, self.shm = self.shm, None
            close_quietly(shm)
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()


class AttachedBlocks:
    """The other side's blocks, attached once and kept while it keeps writing to them."""

    def __init__(self) -> None:
        self._blocks: dict[str, SharedMemory] = {}

    def _get(self, name: str, slot: str) -> SharedMemory:
        shm = self._blocks.get(slot)
        if shm is None or shm.name.lstrip("/") != name.lstrip("/"):
            if shm is not None:  # the writer grew its block: the old one is gone
                close_quietly(shm)
            shm = self._blocks[slot] = attach(name)
        return shm

    def read(self, layout: Layout, slot: str, *, copy: bool) -> dict[str, np.ndarray]:
        """The tensors described by ``layout``; ``copy=False`` gives views into the block,
        valid until the writer's next call (the worker runs on them in place)."""
        out: dict[str, np.ndarray] = dict(layout["inline"])
        if layout["block"] is None:
            for name, dtype, shape, _ in layout["tensors"]:
                out[name] = np.empty(shape, dtype)
            return out
        shm = self._get(layout["block"], slot)
        for name, dtype, shape, offset in layout["tensors"]:
            view: np.ndarray = np.ndarray(shape, dtype, buffer=shm.buf, offset=offset)
            out[name] = view.copy() if copy else view
        return out

    def drop(self, slot: str) -> None:
        shm = self._blocks.pop(slot, None)
        if shm is not None:
            close_quietly(shm)

    def clear(self) -> None:
        for slot in list(self._blocks):
            self.drop(slot)
