"""One graph operator as the partitioner sees it, read from an ONNX or a TFLite file.

It sits in formats so the per-format layer readers and the partitioner both import it from
below, instead of the readers importing the partitioner that calls them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    """One graph operator, reduced to what the partitioner needs."""

    name: str
    op: str
    inputs: tuple[str, ...]   # non-constant tensors read
    outputs: tuple[str, ...]
    flops: int
    weight_bytes: int
