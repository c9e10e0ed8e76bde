"""A digest of tensors: what lets a board trust a plan's output check made on another board.

Two boards of one fingerprint run the same bytes on the same runtimes: the same plan fed the
same calibration inputs gives the same outputs, bit for bit. So a board that publishes a plan
publishes the digest of its calibration inputs and of the plan's outputs on them; a board
adopting the plan whose outputs hash the same has the publisher's output error without
building and running the fp32 reference (a second session of the whole model). Any difference
in a single bit falls back to the reference, so the digest never vouches for a plan that
computes something else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np


def tensors_sha256(feeds: Sequence[Mapping[str, np.ndarray]]) -> str:
    """sha256 over every tensor of every feed: name, dtype, shape and bytes, names sorted."""
    h = hashlib.sha256()
    for feed in feeds:
        h.update(b"\x00feed")
        for name in sorted(feed):
            arr = np.ascontiguousarray(feed[name])
            h.update(f"\x00{name}\x00{arr.dtype.str}\x00{arr.shape}\x00".encode())
            h.update(arr.tobytes())
    return h.hexdigest()
