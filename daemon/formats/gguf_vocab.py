"""Whether two GGUF files share one vocabulary, from their headers alone.

A draft model proposes token ids that the served model verifies: the two must mean the same
text by the same id. The token tables (``tokenizer.ggml.tokens``) are compared whole — their
sizes, then every token's text — before llama.cpp loads the draft.
"""

from __future__ import annotations

from pathlib import Path

from edgepilot.errors import ModelError
from edgepilot.formats.gguf_header import read_header

_KEYS = {"tokenizer.ggml.tokens"}


def check_same_vocab(base: Path, draft: Path, *, field: str) -> int:
    """ModelError (one line naming ``field``, the draft file and what differs) unless ``draft``
    has ``base``'s token table; the vocabulary size otherwise."""
    def refuse(why: str) -> ModelError:
        return ModelError(f"{field}: draft {draft.name} does not share the vocabulary of "
                          f"{base.name}: {why}", field=field)

    mine = read_header(base, _KEYS).fields.get("tokenizer.ggml.tokens")
    theirs = read_header(draft, _KEYS).fields.get("tokenizer.ggml.tokens")
    if not isinstance(theirs, list) or not theirs:
        raise refuse("it has no token table (tokenizer.ggml.tokens)")
    if not isinstance(mine, list) or not mine:
        raise refuse(f"{base.name} has no token table (tokenizer.ggml.tokens)")
    if len(mine) != len(theirs):
        raise refuse(f"{len(theirs)} tokens against {len(mine)}")
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if a != b:
            raise refuse(f"token {i} is {b!r} there, {a!r} here")
    return len(mine)
