"""Dynamic batching: concurrent requests to one model coalesced along the batch dimension.

Triton's dynamic batcher is the model: the first request of a batch waits up to
``[[models]] batch_wait_ms`` for others with the same per-row shapes and dtypes; the batch
runs as soon as it holds ``max_batch`` rows, or once the wait is over and no batch of the
model is in flight (a busy model keeps filling the next batch rather than queueing many small
ones), and its outputs are split back per request.

Where the model is planned, a batch is padded (with copies of its last row, always a valid
input) up to the next power of two, capped at ``max_batch``: the dispatcher plans per
input-shape signature, so a model meets at most log2(max_batch) + 1 batched shapes instead of
one per batch size. Unplanned, a batch runs at its own size: padding a compute-bound model
costs the padded rows' time for nothing.

Rows are independent in a model with a batch dimension, so a request's answer is the same
batched or alone (within the runtime's float tolerance: kernels may sum in another order).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgepilot.backends.base import TensorSpec
from edgepilot.errors import CommandError

log = logging.getLogger(__name__)
Tensors = dict[str, np.ndarray]
RunBatch = Callable[[Tensors, "float | None"], Awaitable[tuple[Tensors, str]]]


def batch_axes(specs: Sequence[TensorSpec]) -> bool:
    """Whether every input has a dynamic first dimension to batch along."""
    return bool(specs) and all(
        len(s.shape) > 0 and not (isinstance(s.shape[0], int) and s.shape[0] > 0)
        for s in specs)


def padded_rows(rows: int, max_batch: int) -> int:
    """The batch size a batch of ``rows`` runs at: the next power of two, at most max_batch."""
    size = 1
    while size < rows:
        size *= 2
    return max(rows, min(size, max_batch))


@dataclass(eq=False)
class _Item:
    inputs: Tensors
    rows: int
    deadline: float | None
    future: asyncio.Future[tuple[Tensors, str]]


@dataclass(eq=False)
class _Batch:
    items: list[_Item] = field(default_factory=list)
    rows: int = 0
    timer: asyncio.TimerHandle | None = None
    due: bool = False  # its wait is over; it goes as soon as the batch in flight is done


class Batcher:
    """Coalesces the requests of one model; ``submit`` answers each with its own rows."""

    def __init__(self, name: str, run: RunBatch, max_batch: int, wait_s: float, *,
                 pad: bool = True) -> None:
        self.name = name
        self.pad = pad
        self.run = run
        self.max_batch = max_batch
        self.wait_s = wait_s
        self._open: dict[tuple[object, ...], _Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self.batches_run = 0  # for status and tests: how many runs served how many requests
        self.requests_batched = 0

    async def submit(self, inputs: Tensors, deadline: float | None) -> tuple[Tensors, str]:
        rows = _rows_of(inputs)
        if rows >= self.max_batch:
            return await self.run(inputs, deadline)
        key = tuple(sorted((n, a.dtype.str, a.shape[1:]) for n, a in inputs.items()))
        batch = self._open.get(key)
        if batch is not None and batch.rows + rows > self.max_batch:
            self._flush(key, batch)  # no room left: it goes now, this request opens the next
            batch = None
        loop = asyncio.get_running_loop()
        if batch is None:
            batch = self._open[key] = _Batch()
            batch.timer = loop.call_later(self.wait_s, self._wait_over, key, batch)
        item = _Item(inputs, rows, deadline, loop.create_future())
        batch.items.append(item)
        batch.rows += rows
        if batch.rows >= self.max_batch:
            self._flush(key, batch)
        return await item.future  # a cancelled request is simply not answered

    def _wait_over(self, key: tuple[object, ...], batch: _Batch) -> None:
        # As Triton's dynamic batcher does with a busy model instance: while a batch is in
        # flight, the next one keeps filling instead of leaving half empty to wait for the
        # device anyway; it goes the moment the one in flight is done.
        batch.due = True
        if self._in_flight == 0:
            self._flush(key, batch)

    def _flush_due(self) -> None:
        for key, batch in list(self._open.items()):
            if batch.due and self._in_flight == 0:
                self._flush(key, batch)

    def _flush(self, key: tuple[object, ...], batch: _Batch) -> None:
        if self._open.get(key) is batch:
            del self._open[key]
        if batch.timer is not None:
            batch.timer.cancel()
        items = [it for it in batch.items if not it.future.done()]
        if not items:
            return
        self._in_flight += 1
        task = asyncio.ensure_future(self._run(items))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._in_flight -= 1
        self._flush_due()

    async def _run(self, items: list[_Item]) -> None:
        total = sum(it.rows for it in items)
        size = padded_rows(total, self.max_batch) if self.pad else total
        if len(items) == 1 and size == total:
            inputs = items[0].inputs
        else:
            inputs = {}
            for name in items[0].inputs:
                parts = [it.inputs[name] for it in items]
                if size > total:  # pad with copies of the last row: a valid input row
                    parts.append(np.repeat(parts[-1][-1:], size - total, axis=0))
                inputs[name] = np.concatenate(parts, axis=0)
        deadlines = [it.deadline for it in items]
        # the batch runs while any of its requests still wants an answer
        deadline = None if None in deadlines else max(d for d in deadlines if d is not None)
        try:
            outputs, plan = await self.run(inputs, deadline)
        except BaseException as exc:
            for it in items:
                if not it.future.done():
                    if isinstance(exc, asyncio.CancelledError):
                        it.future.cancel()
                    else:
                        it.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        self.batches_run += 1
        self.requests_batched += len(items)
        start = 0
        for it in items:
            mine = {name: (out[start:start + it.rows]
                           if out.ndim > 0 and out.shape[0] == size else out)
                    for name, out in outputs.items()}
            start += it.rows
            if not it.future.done():
                it.future.set_result((mine, plan))


def _rows_of(inputs: Tensors) -> int:
    sizes = {a.shape[0] if a.ndim else -1 for a in inputs.values()}
    if len(sizes) != 1 or -1 in sizes:
        raise CommandError("every input needs the same first (batch) dimension for a model "
                           f"served with max_batch; got {sorted(sizes)}", field="inputs")
    return int(sizes.pop())
