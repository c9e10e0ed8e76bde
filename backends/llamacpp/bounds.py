"""Numeric bounds of a JSON schema as grammar rules: ``minimum``/``maximum`` (and the exclusive
ones) on integers, ``minimum: 0`` on numbers.

llama-cpp-python's converter (0.3.x) leaves them out (a TODO in its ``visit``): a pydantic
``conint(ge=1, le=5)`` field came back 2022 and a tool argument bounded 1-5 came back 123,
so an answer said to validate against its schema did not. :func:`converter` is that converter
with integer ranges spelled out digit by digit (no leading zeros, every integer of the range
and none outside it), the rest of its work unchanged.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from edgepilot.backends.llamacpp.runtime import import_llama_cpp

# the converter's own integers hold at most 16 digits; an open range stops there too
MAX_DIGITS = 16


def integer_bounds(schema: dict[str, Any]) -> tuple[int | None, int | None]:
    """The smallest and largest integer ``schema`` allows (None: unbounded), from
    ``minimum``/``maximum``, ``exclusiveMinimum``/``exclusiveMaximum`` (numbers, or draft 4's
    booleans beside ``minimum``/``maximum``)."""
    lo = hi = None
    if isinstance(schema.get("minimum"), int | float):
        lo = math.ceil(schema["minimum"])
        if schema.get("exclusiveMinimum") is True and lo == schema["minimum"]:
            lo += 1
    if isinstance(schema.get("maximum"), int | float):
        hi = math.floor(schema["maximum"])
        if schema.get("exclusiveMaximum") is True and hi == schema["maximum"]:
            hi -= 1
    low, high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(low, int | float) and not isinstance(low, bool):
        lo = math.floor(low) + 1 if lo is None else max(lo, math.floor(low) + 1)
    if isinstance(high, int | float) and not isinstance(high, bool):
        hi = math.ceil(high) - 1 if hi is None else min(hi, math.ceil(high) - 1)
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"no integer lies between the bounds ({lo} > {hi})")
    return lo, hi


def integer_rule(lo: int | None, hi: int | None) -> str:
    """A GBNF expression matching exactly the decimal integers in ``[lo, hi]``."""
    alts = []
    if lo is None or lo < 0:  # "-" and a magnitude from the negative part of the range
        smallest = 1 if hi is None or hi >= 0 else -hi
        alts.append('"-" (' + " | ".join(_naturals(smallest, None if lo is None else -lo))
                    + ")")
    if hi is None or hi >= 0:
        alts += _naturals(0 if lo is None else max(lo, 0), hi)
    return "(" + " | ".join(alts) + ")"


def _naturals(lo: int, hi: int | None) -> list[str]:
    """Alternatives matching the integers ``lo..hi`` (``hi`` None: to MAX_DIGITS digits),
    ``lo >= 0``: one per digit count."""
    first = len(str(lo))
    if hi is None:
        alts = [_same_length(str(lo), "9" * first)]
        if first < MAX_DIGITS:
            alts.append(f"[1-9] [0-9]{{{first},{MAX_DIGITS - 1}}}")
        return alts
    last = len(str(hi))
    return [_same_length(str(lo) if n == first else "1" + "0" * (n - 1),
                         str(hi) if n == last else "9" * n)
            for n in range(first, last + 1)]


def _digits(n: int) -> str:
    return "[0-9]" if n == 1 else f"[0-9]{{{n}}}"


def _same_length(lo: str, hi: str) -> str:
    """The digit strings of one length from ``lo`` to ``hi`` (``lo <= hi``)."""
    i = 0
    while i < len(lo) and lo[i] == hi[i]:
        i += 1
    prefix = f'"{lo[:i]}"' if i else ""
    if i == len(lo):
        return prefix
    a, b, rest = lo[i], hi[i], len(lo) - i - 1
    if rest == 0:
        return f"{prefix} [{a}-{b}]".strip()
    low_all = lo[i + 1:] == "0" * rest    # a's whole block is in the range
    high_all = hi[i + 1:] == "9" * rest   # so is b's
    parts = []
    if not low_all:
        parts.append(f'"{a}" {_wrap(_same_length(lo[i + 1:], "9" * rest))}')
    start = a if low_all else chr(ord(a) + 1)
    end = b if high_all else chr(ord(b) - 1)
    if start <= end:
        parts.append(f"[{start}-{end}] {_digits(rest)}")
    if not high_all:
        parts.append(f'"{b}" {_wrap(_same_length("0" * rest, hi[i + 1:]))}')
    return f"{prefix} ({' | '.join(parts)})".strip()


def _wrap(expr: str) -> str:
    return f"({expr})"


@functools.cache
def converter() -> type:
    """llama-cpp-python's ``SchemaConverter`` with bounded integers (and non-negative
    numbers) as rules of their own."""
    lg = import_llama_cpp().llama_grammar

    class BoundedConverter(lg.SchemaConverter):  # type: ignore[name-defined]
        def visit(self, schema: Any, name: str) -> Any:
            kind = schema.get("type") if isinstance(schema, dict) else None
            if kind in ("integer", "number") and not (
                    {"enum", "const", "$ref", "anyOf", "oneOf", "allOf"} & set(schema)):
                rule = name + "-" if name in lg.RESERVED_NAMES else name or "root"
                if kind == "integer":
                    lo, hi = integer_bounds(schema)
                    if lo is not None or hi is not None:
                        return self._add_rule(rule, integer_rule(lo, hi) + " space")
                elif schema.get("minimum") == 0 and "maximum" not in schema:
                    # a number at least 0: the converter's number without its sign
                    for dep in ("integral-part", "decimal-part"):
                        self._add_primitive(dep, lg.PRIMITIVE_RULES[dep])
                    return self._add_rule(rule, 'integral-part ("." decimal-part)? '
                                                '([eE] [-+]? integral-part)? space')
            return super().visit(schema, name)

    return BoundedConverter
