"""Request bodies read as JSON, every failure a 400 naming the body.

Large bodies are parsed off the event loop with :func:`edgepilot.serving.offload.off_loop`.
"""

from __future__ import annotations

import json
from typing import Any

from edgepilot.errors import CommandError


def parse_json(raw: bytes, empty: Any = None) -> Any:
    """``json.loads`` whose every failure is a 400 naming the body (blocking).

    Nesting deeper than Python's recursion limit raises RecursionError inside the parser,
    which would otherwise surface as a plain-text 500.
    """
    if empty is not None and not raw.strip():
        return empty
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CommandError(f"body is not JSON: {exc}", field="body") from None
    except RecursionError:
        raise CommandError("body is nested too deeply to be a request", field="body") from None
