"""Which chat template a GGUF model's chats are rendered with, and rendering it.

In order, the first that applies:

1. ``[[models]] chat_template = "file.jinja"`` (a Jinja chat template, relative to the model
   dir): ``source: "file"``;
2. the GGUF's own ``tokenizer.chat_template``: ``source: "gguf"`` (llama.cpp renders it);
3. a template chosen for a GGUF without one (``source: "architecture"``): by its
   ``general.architecture`` from :data:`ARCH_TEMPLATES`; for another architecture, by the
   special tokens its vocabulary has (:data:`VOCAB_MARKERS`: a ``llama`` file with
   ``<|im_start|>`` in its vocabulary is ChatML);
4. else the plain-text default (``source: "default"``): ``System: ...`` / ``User: ...`` /
   ``Assistant:`` lines, which any base model continues sensibly.

Templates other than the GGUF's are rendered here, in Jinja's immutable sandbox (a template
cannot touch Python objects or files), and the model completes the rendered prompt with the
template's stop strings; the answer is returned in the chat shape. Before this, a GGUF without
a template was rendered by llama-cpp-python's fallback (Llama-2's ``[INST]``), which small
models answered with an empty message.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgepilot.errors import CommandError, ModelError
from edgepilot.formats import files
from edgepilot.formats.gguf_info import read_gguf_info

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + "
          "'<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Gemma has no system role: system text opens the next user turn
GEMMA = ("{% set ns = namespace(sys='') %}{% for m in messages %}"
         "{% if m.role == 'system' %}{% set ns.sys = ns.sys + m.content + '\\n\\n' %}"
         "{% else %}{% set role = 'model' if m.role == 'assistant' else 'user' %}"
         "{{ '<start_of_turn>' + role + '\\n' + (ns.sys if role == 'user' else '') + m.content"
         " + '<end_of_turn>\\n' }}{% if role == 'user' %}{% set ns.sys = '' %}{% endif %}"
         "{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")
LLAMA3 = ("{% for m in messages %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n'"
          " + m.content + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
PHI3 = ("{% for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content + '<|end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
PLAIN = ("{% for m in messages %}{{ m.role | capitalize }}: {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}Assistant:{% endif %}")

# name -> (template, stop strings)
BUILTIN: dict[str, tuple[str, list[str]]] = {
    "chatml": (CHATML, ["<|im_end|>"]),
    "gemma": (GEMMA, ["<end_of_turn>"]),
    "llama3": (LLAMA3, ["<|eot_id|>"]),
    "phi3": (PHI3, ["<|end|>"]),
    "plain": (PLAIN, ["\nUser:", "\nSystem:", "\nTool:"]),
}
ARCH_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
                  "qwen2": "chatml", "qwen2moe": "chatml", "qwen3": "chatml",
                  "qwen3moe": "chatml", "phi3": "phi3"}
# special tokens in a vocabulary -> the template they belong to (first match wins)
VOCAB_MARKERS = [(b"<|im_start|>", "chatml"), (b"<start_of_turn>", "gemma"),
                 (b"<|start_header_id|>", "llama3"), (b"<|assistant|>", "phi3")]
VOCAB_SCAN_BYTES = 32 * 1024 * 1024  # the header (token table included) sits at the start


@dataclass(frozen=True)
class ChatTemplate:
    """The template of a model's chats: where it came from, its name, its text."""

    source: str  # "file" | "gguf" | "architecture" | "default"
    name: str
    text: str | None  # None: the GGUF's own, rendered by llama.cpp
    stop: tuple[str, ...] = ()

    @property
    def rendered_here(self) -> bool:
        return self.text is not None

    def describe(self) -> dict[str, str]:
        """What ``/v1/models`` and ``/api/show`` say about it."""
        return {"source": self.source, "name": self.name}


_env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True,
                                     lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
_cache: dict[tuple[str, int, int, str | None], ChatTemplate] = {}
_lock = threading.Lock()


@functools.lru_cache(maxsize=32)
def _compiled(text: str) -> jinja2.Template:
    return _env.from_string(text)


def _vocab_template(path: Path) -> str | None:
    with path.open("rb") as f:
        head = f.read(VOCAB_SCAN_BYTES)
    return next((name for marker, name in VOCAB_MARKERS if marker in head), None)


def _file_key(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def template_of(model: files.ResolvedModel, model_dir: Path) -> ChatTemplate:
    """Blocking (cached by file): the chat template of GGUF ``model``."""
    override = model.entry.chat_template
    override_path = None if override is None else (
        override if override.is_absolute() else model_dir / override)
    key = (str(model.path), *_file_key(model.path),
           None if override_path is None else f"{override_path}:{_file_key(override_path)}"
           if override_path.exists() else str(override_path))
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    tpl = _resolve(model, override_path)
    with _lock:
        _cache[key] = tpl
    return tpl


def _resolve(model: files.ResolvedModel, override: Path | None) -> ChatTemplate:
    if override is not None:
        try:
            text = override.read_text(encoding="utf-8")
            _env.from_string(text)
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelError(f"model {model.name!r}: chat_template {override} cannot be read "
                             f"({exc})", field="chat_template") from None
        except jinja2.TemplateSyntaxError as exc:
            raise ModelError(f"model {model.name!r}: chat_template {override} line "
                             f"{exc.lineno}: {exc.message}", field="chat_template") from None
        return ChatTemplate("file", override.name, text)
    info = read_gguf_info(model.path)
    if info.chat_template:
        return ChatTemplate("gguf", "gguf", None)
    name = ARCH_TEMPLATES.get(info.arch) or _vocab_template(model.path)
    if name is None:
        text, stop = BUILTIN["plain"]
        return ChatTemplate("default", "plain", text, tuple(stop))
    text, stop = BUILTIN[name]
    return ChatTemplate("architecture", name, text, tuple(stop))


def render(tpl: ChatTemplate, messages: list[dict[str, Any]],
           tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt of ``messages`` under a template rendered here (sandboxed)."""
    assert tpl.text is not None

    def raise_exception(message: str) -> None:
        raise CommandError(f"the model's chat template refused the messages: {message}",
                           field="messages")

    plain = [{**m, "content": m.get("content") or ""} for m in messages]
    try:
        return _compiled(tpl.text).render(
            messages=plain, tools=tools, add_generation_prompt=True, bos_token="",
            eos_token="", raise_exception=raise_exception)
    except jinja2.TemplateError as exc:
        raise CommandError(f"the chat template ({tpl.source} {tpl.name}) failed on these "
                           f"messages: {exc}", field="messages") from None
