"""Nesting told before parsing: brackets inside strings do not count, escapes are honoured."""

from __future__ import annotations

import json

from edgepilot.json_depth import MAX_DEPTH, too_deep


def test_depth_past_the_limit_is_found_and_strings_do_not_count() -> None:
    assert too_deep(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    assert not too_deep(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    assert too_deep('{"a":' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1))
    # a prompt full of brackets (code, a JSON example) is text, not nesting
    prompt = json.dumps({"messages": [{"role": "user", "content": "[{" * 5000 + '\\"['}]})
    assert not too_deep(prompt) and json.loads(prompt)
    # an escaped quote does not end the string: the brackets after it are still text
    assert not too_deep(b'["\\"' + b"[" * 600 + b'"]')
    # a wide tensor is many brackets side by side, not deep
    wide = json.dumps([[[0.5] * 3] * 4000] * 2).encode()
    assert not too_deep(wide) and not too_deep(b"")
