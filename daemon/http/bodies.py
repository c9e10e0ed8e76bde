"""Request bodies read as JSON, every failure a 400 naming the body.

Large bodies are parsed off the event loop with :func:`edgepilot.serving.offload.off_loop`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from edgepilot.errors import CommandError
from edgepilot.json_depth import MAX_DEPTH, too_deep


def parse_json(raw: bytes, empty: Any = None) -> Any:
    """``json.loads`` whose every failure is a 400 naming the body (blocking).

    Nesting past :data:`MAX_DEPTH` is refused before parsing (``json_depth``); deeper than
    Python's recursion limit it would raise RecursionError in the parser, a plain-text 500.
    """
    if empty is not None and not raw.strip():
        return empty
    deep = CommandError(f"body is nested more than {MAX_DEPTH} levels deep: not a request",
                        field="body")
    if too_deep(raw):
        raise deep
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CommandError(f"body is not JSON: {exc}", field="body") from None
    except RecursionError:  # the limit reached by a parse already deep in the stack
        raise deep from None


# the parts pydantic adds to an error's location to say which branch of a union failed
# ("str", "list[TextPart]", "function-after[_utf8(), str]"): they name no field
_BRANCHES = {"str", "int", "float", "bool", "list", "dict", "none", "null"}


def field_of(loc: Sequence[Any]) -> str | None:
    """The dotted field a pydantic error's location names (``messages.0.content``), without
    the union branches pydantic adds; None for the body as a whole."""
    parts = [str(p) for p in loc
             if not (isinstance(p, str) and (p in _BRANCHES or "[" in p or "(" in p))]
    return ".".join(parts) or None
