"""A JSON Schema ``pattern`` rewritten into the regex subset llama-cpp-python's converter
turns into a grammar llama.cpp can parse.

The converter (0.3.x) copies a regex escape it does not know into the grammar as it stands:
``\\d`` becomes the GBNF literal ``"\\d"``, ``\\.`` the literal ``"\\."``, and llama.cpp's
grammar parser, which knows only ``\\x \\u \\U \\t \\r \\n \\\\ \\" \\[ \\]``, fails on them
("unknown escape") and left the worker to crash on the grammar it did not build (a pydantic
``Field(pattern=r"^[A-Z]{3}-\\d{2}$")`` took a worker down on every retry). It also repeats a
whole literal run for a quantifier on its last character (``-\\d{2}`` read as ``-\\d-\\d``).
So classes are spelled out (``\\d`` as ``[0-9]``), an escaped character outside a class is a
one-character class (``[\\x2E]``), and what a grammar cannot express (word boundaries,
back-references, negated shorthands inside a class) is a 400 naming the schema's field.
"""

from __future__ import annotations

from typing import Any

from edgepilot.errors import CommandError

# shorthand classes as class contents
_CLASS = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " \\t\\n\\r"}
# escapes llama.cpp's grammar parser takes as they are
_KEPT = set("tnr\\")


def _hex(c: str) -> str:
    return f"\\x{ord(c):02X}"


def safe_pattern(pattern: str, field: str) -> str:
    """``pattern`` with its escapes in the form the converter and llama.cpp both take."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c != "\\":
            if c == "[" and not in_class:
                in_class = True
            elif c == "]" and in_class:
                in_class = False
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(pattern):
            raise CommandError(f"{field}: pattern {pattern!r} ends in a lone backslash",
                               field=field)
        e = pattern[i + 1]
        i += 2
        if e.lower() in _CLASS:
            if in_class and e.isupper():
                raise _cannot(field, pattern, f"\\{e} inside a character class")
            body = _CLASS[e.lower()]
            out.append(body if in_class else ("[^" if e.isupper() else "[") + body + "]")
        elif e in _KEPT or (in_class and e in "[]"):
            out.append("\\" + e)
        elif e.isalnum():  # \b \B \1 \p{..} \A \Z ...: nothing a grammar can say
            raise _cannot(field, pattern, f"\\{e}")
        else:  # an escaped punctuation character: itself
            out.append(_hex(e) if in_class else f"[{_hex(e)}]")
    return "".join(out)


def _cannot(field: str, pattern: str, what: str) -> CommandError:
    return CommandError(f"{field}: pattern {pattern!r} uses {what}, which llama.cpp grammars "
                        "cannot express; write the characters out (e.g. [0-9] for \\d)",
                        field=field)


def safe_patterns(schema: Any, field: str) -> Any:
    """``schema`` (a copy) with every string ``pattern`` rewritten by :func:`safe_pattern`."""
    if isinstance(schema, dict):
        return {k: safe_pattern(v, field) if k == "pattern" and isinstance(v, str)
                else safe_patterns(v, field) for k, v in schema.items()}
    if isinstance(schema, list):
        return [safe_patterns(v, field) for v in schema]
    return schema
