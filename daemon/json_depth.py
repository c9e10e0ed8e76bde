"""How deeply a JSON text nests, told before it is parsed.

``json.loads`` recurses once per ``[``/``{``; a command nested past Python's recursion limit
makes the parser raise RecursionError at the very bottom of the stack. Catching it answers the
client, but anything else that runs that deep meanwhile (the garbage collector reporting an
ignored exception, a logging handler) overflows too, in whatever thread it happens. Refusing
such a text before the parser sees it keeps every parse far from the limit.
"""

from __future__ import annotations

import re

import numpy as np

# far deeper than any request (a rank-8 tensor as nested lists is 8 deep), far from the
# ~1000 frames Python allows
MAX_DEPTH = 256

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = frozenset(b"[{")


def too_deep(raw: bytes | str, limit: int = MAX_DEPTH) -> bool:
    """Whether ``raw`` opens more than ``limit`` arrays/objects inside each other (brackets in
    strings not counted). Not a validator: malformed text is left for the parser to name."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") <= limit:  # the common case: no scan at all
        return False
    bare = _STRING.sub(b"", data)
    codes = np.frombuffer(bare, dtype=np.uint8)
    step = np.zeros(len(codes), dtype=np.int32)
    step[np.isin(codes, list(_OPEN))] = 1
    step[(codes == ord("]")) | (codes == ord("}"))] = -1
    return bool(len(step)) and int(np.cumsum(step).max()) > limit
