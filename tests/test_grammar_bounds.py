"""Numeric bounds as grammar rules (backends/llamacpp/bounds.py): the integers a rule matches
are exactly those of its range, checked against every integer near the bounds and random
ones, through the rule read as a regular expression."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgepilot.backends.llamacpp.bounds import integer_bounds, integer_rule
from edgepilot.backends.llamacpp.grammar import schema_gbnf
from edgepilot.errors import CommandError


def as_regex(rule: str) -> re.Pattern[str]:
    """The GBNF subset integer_rule writes ("lit", [a-b], {m,n}, ( | )) as a regex."""
    out, i = [], 0
    while i < len(rule):
        c = rule[i]
        if c == '"':
            end = rule.index('"', i + 1)
            out.append(re.escape(rule[i + 1:end]))
            i = end + 1
        elif c == "[":
            end = rule.index("]", i)
            out.append(rule[i:end + 1])
            i = end + 1
        else:
            out.append("" if c == " " else c)
            i += 1
    return re.compile("".join(out))


bound = st.one_of(st.none(), st.integers(-10**7, 10**7))


@settings(max_examples=150, deadline=None)
@given(lo=bound, hi=bound, probes=st.lists(st.integers(-10**8, 10**8), max_size=40))
def test_a_range_rule_matches_its_integers_and_no_others(lo: int | None, hi: int | None,
                                                          probes: list[int]) -> None:
    if (lo is None and hi is None) or (lo is not None and hi is not None and lo > hi):
        return
    rx = as_regex(integer_rule(lo, hi))
    near = [v + d for v in (lo, hi, 0) if v is not None for d in range(-12, 13)]
    for v in near + probes:
        inside = (lo is None or v >= lo) and (hi is None or v <= hi)
        assert bool(rx.fullmatch(str(v))) == inside, (lo, hi, v)
    for bad in ("-0", "01", "007", "+1", ""):  # never what JSON forbids
        assert not rx.fullmatch(bad), (lo, hi, bad)


def test_exclusive_and_fractional_bounds_are_the_integers_inside() -> None:
    assert integer_bounds({"minimum": 1, "maximum": 5}) == (1, 5)
    assert integer_bounds({"exclusiveMinimum": 0, "exclusiveMaximum": 10}) == (1, 9)
    assert integer_bounds({"minimum": 0.5, "maximum": 4.5}) == (1, 4)
    assert integer_bounds({"minimum": 2, "exclusiveMinimum": True}) == (3, None)  # draft 4
    with pytest.raises(ValueError):
        integer_bounds({"minimum": 5, "maximum": 3})


def test_schemas_with_bounds_and_untyped_properties_convert() -> None:
    gbnf = schema_gbnf({"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 5},
        "title": {"title": "Title"},           # a property named like an annotation
        "x": {"title": "X", "description": "anything"},
        "l": {"type": "array", "items": {"title": "Item"}}}}, "format")
    assert "[1-5]" in gbnf and "Unrecognized" not in gbnf
    with pytest.raises(CommandError) as err:  # no integer between the bounds: a 400
        schema_gbnf({"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 5, "maximum": 3}}}, "format")
    assert err.value.field == "format"
