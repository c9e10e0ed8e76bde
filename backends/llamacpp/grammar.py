"""Grammar-constrained generation: llama.cpp grammars (GBNF) built from JSON schemas.

A schema is checked twice before llama.cpp sees it: as JSON Schema (``jsonschema``'s
meta-schema check) and by llama-cpp-python's converter to GBNF, both in the caller's process.
llama.cpp parses a grammar in native code where a malformed one can take the process down, so
only grammars that came out of the converter are ever passed on. The result is a
``LlamaGrammar`` (plain text inside: it crosses to a worker process like any parameter).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema

from edgepilot.backends.llamacpp.bounds import converter
from edgepilot.backends.llamacpp.patterns import safe_patterns
from edgepilot.backends.llamacpp.runtime import import_llama_cpp
from edgepilot.errors import CommandError

# any JSON object: what "json_object" / Ollama's format "json" asks for (an object, as both
# OpenAI and Ollama document; llama.cpp's own JSON grammar would also allow bare values)
ANY_OBJECT: dict[str, Any] = {"type": "object"}
MAX_SCHEMA_BYTES = 64 * 1024
# llama-cpp-python's converter (0.3.x) lets a JSON string hold any character but a quote or a
# backslash: a raw newline or tab too, which JSON forbids (json.loads, pydantic and the OpenAI
# SDK's `.parse()` refuse it). llama.cpp's own converter excludes the control characters; so
# does every grammar handed to it here.
_LOOSE_CHAR = r'[^"\\]'
_JSON_CHAR = r'[^"\\\x7F\x00-\x1F]'


def check_schema(schema: Any, field: str) -> dict[str, Any]:
    """``schema`` if it is a JSON Schema object llama.cpp can be constrained by; else a
    CommandError naming ``field``."""
    if not isinstance(schema, dict):
        raise CommandError(f"{field} must be a JSON Schema object, got "
                           f"{type(schema).__name__}", field=field)
    text = json.dumps(schema)
    if len(text) > MAX_SCHEMA_BYTES:
        raise CommandError(f"{field} is {len(text)} bytes; allowed at most {MAX_SCHEMA_BYTES}",
                           field=field)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise CommandError(f"{field} is not a valid JSON Schema: {exc.message}"
                           + (f" (at {where})" if where else ""), field=field) from None
    return schema


def schema_gbnf(schema: dict[str, Any], field: str) -> str:
    """The GBNF grammar of ``schema`` (checked first); CommandError naming ``field`` when the
    converter cannot express it (remote $ref, unsupported keyword combinations).

    llama-cpp-python's converter resolves a ``$ref`` from the document's root but cannot
    start from one, nor follow ``#`` itself: a schema whose root is a ``$ref`` (pydantic's
    for a recursive model) or that refers to itself is converted as a definition of its own
    (:func:`hoisted`) when it fails as it is.

    The last :data:`CACHED_SCHEMAS` grammars are kept by the schema's JSON text (in its own
    key order, which is the order the grammar writes properties in): an agent sends the same
    tools every turn, and checking and converting five of them took 20 ms a request here,
    most of it ``jsonschema``'s meta-schema check. A schema that fails is checked again each
    time, so its error names the field of the request at hand."""
    if not isinstance(schema, dict):
        check_schema(schema, field)  # its error, before JSON text is asked of it
    return _cached_gbnf(json.dumps(schema), field)


CACHED_SCHEMAS = 64


@functools.lru_cache(maxsize=CACHED_SCHEMAS)
def _cached_gbnf(text: str, field: str) -> str:
    return _schema_gbnf(json.loads(text), field)


def _schema_gbnf(schema: dict[str, Any], field: str) -> str:
    check_schema(schema, field)
    schema = _untyped_as_any(_no_empty_items(safe_patterns(schema, field)))
    try:
        gbnf = _convert(schema)
    except _CONVERTER_ERRORS as exc:
        if not has_ref(schema):
            raise _cannot(field, exc) from None
        try:
            gbnf = _convert({"anyOf": [{"$ref": "#/$defs/schema"}],
                             "$defs": hoisted(schema, "schema")})
        except _CONVERTER_ERRORS:
            raise _cannot(field, exc) from None
    return _checked_escapes(gbnf.replace(_LOOSE_CHAR, _JSON_CHAR), field)


# the escapes llama.cpp's grammar parser knows (any other is "unknown escape": no grammar)
_GBNF_ESCAPES = set('xuUtrn\\"[]')


def _checked_escapes(gbnf: str, field: str) -> str:
    """``gbnf`` when every backslash escape in it is one llama.cpp parses; else a 400 naming
    ``field`` (a grammar llama.cpp fails to parse left a worker to crash on it)."""
    i = gbnf.find("\\")
    while i != -1:
        nxt = gbnf[i + 1:i + 2]
        if nxt not in _GBNF_ESCAPES:
            raise CommandError(f"{field}: llama.cpp cannot constrain generation to this schema "
                               f"(its grammar would hold the escape \\{nxt}, which llama.cpp "
                               "does not parse)", field=field)
        i = gbnf.find("\\", i + 2)
    return gbnf


def _no_empty_items(schema: Any) -> Any:
    """``schema`` without ``items: {}`` / ``items: true`` (any item: an array of ``Any``, a
    recursive model LangChain flattened), which the converter reads as no items at all and
    fails on (KeyError: 'prefixItems'); without ``items`` it takes any JSON values."""
    if isinstance(schema, dict):
        return {k: _no_empty_items(v) for k, v in schema.items()
                if not (k == "items" and (v == {} or v is True))}
    if isinstance(schema, list):
        return [_no_empty_items(v) for v in schema]
    return schema


# any JSON value: what a nested schema of no keywords but annotations allows (pydantic writes
# ``{"title": "Value"}`` for an ``Any`` field); the converter refused it ("Unrecognized
# schema") and read ``{}`` as an object only
ANY_VALUE: dict[str, Any] = {"type": ["string", "number", "boolean", "object", "array", "null"]}
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated",
                "readOnly", "writeOnly"}
_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then",
        "else")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def _untyped_as_any(schema: Any, nested: bool = False) -> Any:
    """``schema`` with each nested schema of annotations only (or none) as :data:`ANY_VALUE`,
    walking schema positions only (a property named "title" is a name, not an annotation)."""
    if not isinstance(schema, dict):
        return schema
    if nested and set(schema) <= _ANNOTATIONS:
        return dict(ANY_VALUE)
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = _untyped_as_any(out[key], True)
    for key in _LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_untyped_as_any(v, True) for v in out[key]]
    for key in _MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {n: _untyped_as_any(v, True) for n, v in out[key].items()}
    return out


_CONVERTER_ERRORS = (ValueError, KeyError, TypeError, AttributeError, NotImplementedError,
                     RecursionError, AssertionError)


def _convert(schema: dict[str, Any]) -> str:
    """llama-cpp-python's ``json_schema_to_gbnf``, with numeric bounds (bounds.py)."""
    conv = converter()(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    conv.visit(conv.resolve_refs(json.loads(json.dumps(schema)), "stdin"), "")
    return str(conv.format_grammar())


def _cannot(field: str, exc: BaseException) -> CommandError:
    return CommandError(f"{field}: llama.cpp cannot constrain generation to this schema "
                        f"({type(exc).__name__}: {exc})", field=field)


def hoisted(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """``schema`` as definitions of another document's root ``$defs``: itself as ``name``,
    each of its own ``$defs``/``definitions`` as ``name`` + their name, every local ``$ref``
    rewritten to match (``#`` itself included). Several tools' parameters, each with its own
    ``$defs`` (pydantic's nested models and enums), then share one grammar: llama-cpp-python's
    converter resolves references from the root only, and follows none that sits beside a
    ``$ref`` (a root ``$ref`` with its ``$defs``)."""
    local: dict[str, Any] = {}
    for key in ("definitions", "$defs"):
        if isinstance(schema.get(key), dict):
            local.update(schema[key])
    body = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}

    def pointer(ref: str) -> str:
        for prefix in ("#/$defs/", "#/definitions/"):
            if ref.startswith(prefix):
                return f"#/$defs/{name}{ref[len(prefix):]}"
        return f"#/$defs/{name}{ref[1:]}" if ref == "#" or ref.startswith("#/") else ref

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: pointer(v) if k == "$ref" and isinstance(v, str) else rewrite(v)
                    for k, v in node.items()}
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    return {name: rewrite(body), **{name + key: rewrite(v) for key, v in local.items()}}


def has_ref(schema: Any) -> bool:
    """Whether ``schema`` holds a ``$ref`` anywhere."""
    return "\"$ref\"" in json.dumps(schema)


def grammar_of(gbnf: str, field: str = "grammar") -> Any:
    """A ``LlamaGrammar`` for a grammar text from :func:`schema_gbnf`; it carries the request
    field it came from (:func:`field_of`), for an error about it after it left the request."""
    grammar = import_llama_cpp().LlamaGrammar.from_string(gbnf, verbose=False)
    grammar.edgepilot_field = field.split(".")[0]
    return grammar


def field_of(grammar: Any) -> str:
    """The request field a grammar came from (``format``, ``response_format``, ``tools``)."""
    return str(getattr(grammar, "edgepilot_field", "grammar"))


def text_of(grammar: Any) -> str | None:
    """The GBNF text of a ``LlamaGrammar`` (None when it is not one)."""
    text = getattr(grammar, "_grammar", None)
    return text if isinstance(text, str) else None


def schema_grammar(schema: dict[str, Any] | None, field: str) -> Any:
    """A ``LlamaGrammar`` that makes llama.cpp write JSON valid against ``schema`` (None: any
    JSON object)."""
    return grammar_of(schema_gbnf(ANY_OBJECT if schema is None else schema, field), field)
