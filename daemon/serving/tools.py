"""Tool calls for GGUF chat: the tools a request declares, the prompt and grammar that make the
model call them, and the parse of its answer into ``tool_calls``.

Generation is constrained by a grammar built from the tools' JSON schemas: a call the model
writes is always ``{"name": <a declared tool>, "arguments": <valid for that tool>}``, alone or
in a list (the form SmolLM2 and other small models were trained to call in), which may hold
several calls (``parallel_tool_calls``, OpenAI's default, and Ollama's answers), or one.
``tool_choice`` ``"required"`` (or one named function) allows only a call; ``"auto"`` (and
every Ollama request with tools) allows a call or a plain-text answer that does not start with
``{``, ``[`` or ``"``: one token is generated under that grammar first, and a text answer is
then generated without it, streamed as any chat (:meth:`ToolRequest.chooses_text`);
``"none"`` leaves the tools out.

The prompt: a model whose chat template renders tools (its Jinja mentions ``tools``) gets them
through its template, and the conversation's tool calls (their arguments as objects) and tool
results as they are; where that template asks for calls inside ``<tool_call>`` tags (Hermes,
Qwen), the grammar takes them so too. Any other
model gets the generic prompt, :data:`GENERIC_PROMPT` with the tools as JSON, at the start of
the last user message (small models follow it there more than in a system prompt); its earlier
calls are written back as that JSON and tool results become user messages
``Result of <tool>: ...``, which every template can render.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from edgepilot.backends.llamacpp.grammar import grammar_of, has_ref, hoisted, schema_gbnf
from edgepilot.errors import CommandError
from edgepilot.formats.gguf_info import read_gguf_info
from edgepilot.serving.registry import ModelRegistry
from edgepilot.serving.templates import template_of

GENERIC_PROMPT = (
    "You can call these tools (JSON Schema of each one's arguments):\n{tools}\n"
    "To call a tool, answer with only one JSON object: "
    "{{\"name\": <tool name>, \"arguments\": {{<arguments>}}}}.{otherwise}")
_OTHERWISE = " If no tool fits, answer the user in plain text instead."
TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"
_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
# a JSON key as a template writes it, its quotes escaped inside a Jinja string or not
_QUOTED_PARAMETERS = re.compile(r'\\?"parameters\\?"')
_QUOTED_ARGUMENTS = re.compile(r'\\?"arguments\\?"')


def chat_template_of(registry: ModelRegistry, name: str) -> str | None:
    """Blocking (reads the header once, then cached): the chat template model ``name``
    renders with (its GGUF's); None for a model without one or a tensor model."""
    model = registry.catalog.resolve(name)
    if model.kind != "gguf":
        return None
    tpl = template_of(model, registry.config.model_dir)
    return read_gguf_info(model.path).chat_template if tpl.text is None else tpl.text


def template_renders_tools(template: str | None) -> bool:
    """Whether a chat template uses the ``tools`` it is given."""
    return bool(template) and "tools" in str(template)


def tags_calls(template: str | None) -> bool:
    """Whether a template that renders tools has its model write each call inside
    ``<tool_call>`` tags (Hermes 2 Pro and 3, Qwen 2.5 and 3, SmolLM3 and their fine-tunes)."""
    return template_renders_tools(template) and TAG_OPEN in str(template)


def arguments_key(template: str | None) -> str:
    """The key a template has its model write a call's arguments under: ``parameters`` where
    it asks for them so and never for ``arguments`` (Llama 3.1-3.3's ``{"name": function name,
    "parameters": dictionary of argument name and its value}``), else ``arguments``."""
    text = str(template or "")
    if template_renders_tools(template) and _QUOTED_PARAMETERS.search(text) \
            and not _QUOTED_ARGUMENTS.search(text):
        return "parameters"
    return "arguments"


def untagged(text: str) -> str:
    """``<tool_call>{...}</tool_call>`` calls as the JSON list of them (the last one as far as
    it was written); any other text as it is."""
    if not text.lstrip().startswith(TAG_OPEN):
        return text
    return "[" + ", ".join(p.strip() for p in _TAGGED.findall(text)) + "]"


@dataclass
class ToolRequest:
    """A chat request's tools, ready for llama.cpp: messages, grammar, and the answer's parse."""

    names: list[str]
    messages: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    auto: bool = False  # a call or plain text, as the model chooses (see :meth:`text_params`)
    # under auto with an answer schema (response_format, format): the grammar the first token
    # is chosen under (a call or text, as without one), and the answer's own grammar for a
    # text choice: the model still chooses between calling and answering, and its answer
    # follows the schema (under the call-or-answer grammar alone, a small model prompted with
    # tools wrote a call every time)
    probe: Any = None
    answer: Any = None
    tagged: bool = False  # calls written inside <tool_call> tags, as the template asks
    key: str = "arguments"  # the key of a call's arguments (see :func:`arguments_key`)

    @property
    def active(self) -> bool:
        return bool(self.names)

    def text_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` (a request's, with :attr:`params` in them) for the plain-text answer
        the model chose under ``auto``: no grammar (under the grammar of a call or text,
        every token of a text paid for it, 11x slower here, and none could stream), the
        first token kept from opening a call (``text_first``: backends/llamacpp). With an
        answer schema, the answer is generated under its grammar instead."""
        if self.answer is not None:
            return {**params, "grammar": self.answer}
        return {**{k: v for k, v in params.items() if k != "grammar"}, "text_first": True}

    async def chooses_text(self, generate: Callable[[dict[str, Any]], Awaitable[Any]],
                           params: dict[str, Any]) -> bool:
        """Under ``auto``: whether the model's answer is plain text, from one token generated
        under the grammar of both (its first character tells: a call opens ``{`` or ``[``).
        ``generate`` runs the request's chat with the parameters it is given, whole."""
        if not (self.active and self.auto):
            return False
        first = await generate({**params, "max_tokens": 1,
                                **({"grammar": self.probe} if self.probe is not None else {})})
        choice = (first.get("choices") or [{}])[0]
        text = (choice.get("message") or {}).get("content") or ""
        if self.tagged:  # under its grammar, only the tags may follow a leading newline
            return bool(text.strip()) and not text.lstrip().startswith(("{", "[", "<"))
        return bool(text) and not text.startswith(("{", "["))

    def parse(self, text: str) -> list[dict[str, Any]] | None:
        """The calls in a generated answer (OpenAI's shape, ``arguments`` a JSON string), or
        None for a plain-text answer."""
        if self.tagged:
            text = untagged(text)
        if not self.active or not text.lstrip().startswith(("{", "[")):
            return None
        try:
            # not strict: a raw control character inside a string (a model writing a newline
            # where no grammar held it) is still the call it meant; re-dumped escaped below
            call = json.loads(text, strict=False)
        except json.JSONDecodeError:
            # cut off by max_tokens: a list's complete calls are still calls (a small model
            # allowed several went on calling); else the text is returned as it is
            call = _complete_items(text)
        calls = call if isinstance(call, list) else [call]  # a list: one call or several
        # a call holds its name and arguments only: a JSON answer (under an answer schema)
        # may hold a "name" that happens to be a tool's
        if not calls or not all(isinstance(c, dict) and c.get("name") in self.names
                                and set(c) <= {"name", self.key} for c in calls):
            return None
        unique = {json.dumps([c["name"], c.get(self.key) or {}], sort_keys=True): c
                  for c in calls}  # a model repeating a call means it once
        return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                 "function": {"name": c["name"],
                              "arguments": json.dumps(c.get(self.key) or {})}}
                for c in unique.values()]


_NAME = re.compile(r'^\s*(?:\[|<tool_call>)?\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*'
                   r'(?:,\s*"(?:arguments|parameters)"\s*:\s*)?')


def cut_call(text: str, names: list[str]) -> dict[str, Any] | None:
    """A call cut off by ``max_tokens`` after its tool's name, as OpenAI answers one: its
    ``arguments`` the JSON text written so far (with ``finish_reason: "length"``, the caller's);
    None when the text is no call or ends before the name."""
    m = _NAME.match(text)
    if m is None or m.group(1) not in names:
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": m.group(1), "arguments": text[m.end():]}}


def _complete_items(text: str) -> list[Any]:
    """The items of a JSON list cut off before its end that were complete (none: [])."""
    decoder = json.JSONDecoder(strict=False)
    rest = text.lstrip()
    items: list[Any] = []
    if not rest.startswith("["):
        return []
    pos = 1
    while True:
        while pos < len(rest) and rest[pos] in " \t\r\n,":
            pos += 1
        try:
            item, pos = decoder.raw_decode(rest, pos)
        except json.JSONDecodeError:
            return items
        items.append(item)


def _schema(tool: dict[str, Any], i: int, field: str) -> tuple[str, dict[str, Any]]:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise CommandError("each tool needs function.name", field=f"{field}.{i}.function.name")
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise CommandError("function.parameters must be a JSON Schema object",
                           field=f"{field}.{i}.function.parameters")
    return fn["name"], params


def _arguments(text: Any) -> Any:
    try:
        return json.loads(text or "{}")
    except (json.JSONDecodeError, TypeError):
        return text  # a client's own malformed call: written back as it sent it


def _objects_as_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """A message for a template that renders calls itself: each earlier call's ``arguments``
    as the object it holds (OpenAI sends a JSON string; templates write ``arguments | tojson``
    and expect an object, as Hugging Face's do: a string came out quoted and escaped)."""
    if message.get("role") != "assistant" or not message.get("tool_calls"):
        return dict(message)
    calls = []
    for c in message["tool_calls"]:
        fn = dict(c.get("function") or {})
        fn["arguments"] = _arguments(fn.get("arguments"))
        calls.append({**c, "function": fn})
    return {**message, "tool_calls": calls}


def _generic_messages(messages: list[dict[str, Any]], tools_json: str, auto: bool
                      ) -> list[dict[str, Any]]:
    text = GENERIC_PROMPT.format(tools=tools_json, otherwise=_OTHERWISE if auto else "")
    out: list[dict[str, Any]] = []
    called: dict[str, str] = {}  # call id -> tool: OpenAI's tool messages carry the id only
    for m in messages:
        if m["role"] == "tool":
            name = m.get("name") or called.get(m.get("tool_call_id") or "") or "the tool"
            out.append({"role": "user", "content": f"Result of {name}: {m.get('content', '')}"})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            called.update((c.get("id") or "", c["function"]["name"]) for c in m["tool_calls"])
            calls = [json.dumps({"name": c["function"]["name"],
                                 "arguments": _arguments(c["function"].get("arguments"))})
                     for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(calls)})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    # small models follow an instruction in the user's turn far more than one in the system
    # prompt: the tools open the last user message (else they go in the system message)
    last = max((i for i, m in enumerate(out) if m["role"] == "user"), default=None)
    if last is not None:
        out[last] = {"role": "user", "content": f"{text}\n\n{out[last]['content']}"}
    elif out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{text}"}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


def tool_request(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 tool_choice: str | dict[str, Any] | None, template: str | None,
                 field: str = "tools", parallel: bool = True,
                 answer: dict[str, Any] | None = None,
                 answer_field: str = "response_format") -> ToolRequest:
    """Messages and grammar for a chat with ``tools`` (OpenAI's shapes); CommandError naming
    the field for a malformed tool, a bad schema or a ``tool_choice`` naming no tool.
    ``parallel``: a list may hold several calls (OpenAI's ``parallel_tool_calls``, its
    default; Ollama's answers too), else one. ``answer``: the schema a text answer must
    follow (``response_format``, Ollama's ``format``): under ``auto`` the answer is a call or
    JSON valid against it (an agent with tools and an output type), never free text;
    ``answer_field`` is the request field that schema came from, named by its errors."""
    if not tools or tool_choice == "none":
        return ToolRequest([], messages)
    declared = [_schema(t, i, field) for i, t in enumerate(tools)]
    names = [n for n, _ in declared]
    if len(set(names)) != len(names):
        raise CommandError("tool names must be unique", field=field)
    for i, (_, schema) in enumerate(declared):
        schema_gbnf(schema, f"{field}.{i}.function.parameters")  # each checked on its own
    answer_gbnf = None if answer is None else schema_gbnf(answer, answer_field)
    auto = tool_choice in (None, "auto")
    if isinstance(tool_choice, dict):
        wanted = (tool_choice.get("function") or {}).get("name")
        if wanted not in names:
            raise CommandError(f"tool_choice names {wanted!r}, which is not among the tools; "
                               f"allowed: {', '.join(names)}", field="tool_choice.function.name")
        declared = [(n, s) for n, s in declared if n == wanted]
    elif tool_choice not in (None, "auto", "required"):
        raise CommandError(f"tool_choice {tool_choice!r} is not allowed; allowed \"none\", "
                           "\"auto\", \"required\" or {\"type\": \"function\", \"function\": "
                           "{\"name\": ...}}", field="tool_choice")
    # a tool's parameters with references ($defs: pydantic's nested models and enums) sit in
    # the grammar's own $defs (``hoisted``): inside "arguments" they would resolve against the
    # call's root and miss
    defs: dict[str, Any] = {}
    for i, (_, schema) in enumerate(declared):
        if has_ref(schema):
            defs.update(hoisted(schema, f"tool{i}"))
    key = arguments_key(template)
    call: dict[str, Any] = {"anyOf": [
        {"type": "object", "additionalProperties": False, "required": ["name", key],
         "properties": {"name": {"const": name},
                        key: {"$ref": f"#/$defs/tool{i}"} if f"tool{i}" in defs
                        else schema}}
        for i, (name, schema) in enumerate(declared)]}
    if defs:
        call["$defs"] = defs
    # a call is one JSON object, or a list holding it: the form small models are trained to
    # call tools in (SmolLM2's `[{"name": ..., "arguments": ...}]`); a model that opens a list
    # means a call, and under "auto" that first character is its choice, so a list must not
    # fall to the text branch
    more = ' ("," space call)*' if parallel else ""
    structured = _call_or_answer(dict(call), answer, parallel, field) \
        if auto and answer is not None else None
    tagged = tags_calls(template)
    gbnf = schema_gbnf(call, field).replace("root ::=", "call ::=", 1) \
        + f'\nroot ::= call | "[" space call{more} "]" space'
    if tagged:  # the model's own form: <tool_call>\n{...}\n</tool_call>, one after another
        # a model may open its turn with a newline first (text may not)
        gbnf += ' | tws tagged' + (" (tws tagged)*" if parallel else "") + " tws"
    # or text that does not start a JSON object, list or string: a model that opens a string
    # under auto means structured output too (SmolLM2-135M answered '"HassTurnOn"' to 2 of 10
    # home-automation requests; with text unable to open a string, 1 of them became a call)
    if auto:
        gbnf += ' | text\ntext ::= [^{["' + ("<" if tagged else "") + ' \\t\\n] [^\\x00]*'
    if tagged:
        gbnf += (f'\ntagged ::= "{TAG_OPEN}" tws call tws "{TAG_CLOSE}"'
                 "\ntws ::= [ \\t\\n]{0,4}")
    gbnf += "\n"
    if template_renders_tools(template):
        out = [_objects_as_arguments(m) for m in messages]
        params: dict[str, Any] = {"tools": tools}
    else:
        about = {t["function"]["name"]: t["function"].get("description") for t in tools}
        listing = json.dumps([{"name": n, "description": about.get(n) or "", "parameters": s}
                              for n, s in declared])
        out, params = _generic_messages(messages, listing, auto), {}
    if structured is None:
        params["grammar"] = grammar_of(gbnf, "tools")
        return ToolRequest([n for n, _ in declared], out, params, auto=auto, tagged=tagged,
                           key=key)
    assert answer_gbnf is not None
    params["grammar"] = grammar_of(structured, "tools")  # a JSON first token: call or answer
    return ToolRequest([n for n, _ in declared], out, params, auto=auto, tagged=tagged, key=key,
                       probe=grammar_of(gbnf, "tools"),
                       answer=grammar_of(answer_gbnf, answer_field))


def _call_or_answer(call: dict[str, Any], answer: dict[str, Any], parallel: bool,
                    field: str) -> str:
    """One grammar for a call, a list of calls, or JSON valid against ``answer``: one schema
    (each part under its own ``$defs`` name), so one converter names every rule once."""
    defs = dict(call.pop("$defs", {}))
    defs["edgepilot-call"] = call
    defs.update(hoisted(answer, "edgepilot-answer"))
    calls = {"type": "array", "items": {"$ref": "#/$defs/edgepilot-call"}, "minItems": 1,
             **({} if parallel else {"maxItems": 1})}
    return schema_gbnf({"anyOf": [{"$ref": "#/$defs/edgepilot-call"}, calls,
                                  {"$ref": "#/$defs/edgepilot-answer"}], "$defs": defs}, field)
