"""Embeddings as the OpenAI and Ollama APIs hand them out: shortened to ``dimensions`` and
L2-normalised again, as OpenAI's and Ollama's shortened embeddings are (a dot product of
truncated unit vectors is no cosine similarity)."""

from __future__ import annotations

import math

from edgepilot.errors import CommandError

# OpenAI's limit on texts per embeddings request (LangChain sends 1000 at a time)
MAX_TEXTS = 2048


def count_ok(n: int) -> None:
    """Refuse a request of no text or of more than :data:`MAX_TEXTS`, naming ``input``."""
    if not 1 <= n <= MAX_TEXTS:
        raise CommandError(f"input has {n} texts; allowed 1..{MAX_TEXTS}", field="input")


def shortened(vectors: list[list[float]], dimensions: int | None) -> list[list[float]]:
    """The first ``dimensions`` values of each vector, at unit length again (None: as they
    are); more dimensions than the model's is a 400 naming the field and the allowed range."""
    if dimensions is None or not vectors:
        return vectors
    size = len(vectors[0])
    if dimensions > size:
        raise CommandError(f"dimensions {dimensions} is over this model's {size}; allowed "
                           f"1..{size}", field="dimensions")
    out = []
    for v in vectors:
        cut = v[:dimensions]
        norm = math.sqrt(sum(x * x for x in cut))
        out.append([x / norm for x in cut] if norm > 0 else cut)
    return out
