"""What an Ollama client sends: the request bodies of ``/api/*`` and their ``options``.

Bodies are validated here rather than by FastAPI so that a bad value is a 400 naming the field
(``options.temperature``), as Ollama answers, in the daemon's one error shape. ``options`` map
onto llama.cpp's sampler (:data:`SAMPLER_OPTIONS`); options that configure a model load
(``num_thread``, ``num_gpu``, ...) are checked for type and otherwise left to the model's config
(:data:`LOAD_OPTIONS`), but for ``num_ctx``: a request asking a context the model is not loaded
with reloads it with that one (:func:`num_ctx_option`), as Ollama does; options Ollama does not
know are ignored, as Ollama ignores them.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgepilot.errors import CommandError
from edgepilot.http.bodies import field_of

# option -> (llama.cpp parameter, type, (min, max) or None); bounds as llama.cpp accepts them
SAMPLER_OPTIONS: dict[str, tuple[str, type, tuple[float, float] | None]] = {
    "temperature": ("temperature", float, (0.0, 100.0)),
    "top_p": ("top_p", float, (0.0, 1.0)),
    "top_k": ("top_k", int, (0, 1 << 20)),
    "min_p": ("min_p", float, (0.0, 1.0)),
    "typical_p": ("typical_p", float, (0.0, 1.0)),
    "tfs_z": ("tfs_z", float, (0.0, 100.0)),
    "repeat_penalty": ("repeat_penalty", float, (0.0, 100.0)),
    "presence_penalty": ("presence_penalty", float, (-100.0, 100.0)),
    "frequency_penalty": ("frequency_penalty", float, (-100.0, 100.0)),
    "mirostat": ("mirostat_mode", int, (0, 2)),
    "mirostat_tau": ("mirostat_tau", float, (0.0, 100.0)),
    "mirostat_eta": ("mirostat_eta", float, (0.0, 100.0)),
    "seed": ("seed", int, (-(1 << 63), (1 << 63) - 1)),
}
# options that configure a model load: type-checked, the loaded model's settings apply
LOAD_OPTIONS: dict[str, type] = {
    "num_ctx": int, "num_batch": int, "num_gpu": int, "main_gpu": int, "num_thread": int,
    "num_keep": int, "repeat_last_n": int, "numa": bool, "low_vram": bool, "use_mmap": bool,
    "use_mlock": bool, "vocab_only": bool, "logits_all": bool, "embedding_only": bool,
    "f16_kv": bool, "penalize_newline": bool,
}
MAX_STOP = 16
B = TypeVar("B", bound=BaseModel)


def _number(name: str, value: Any, kind: type, bounds: tuple[float, float] | None) -> Any:
    field = f"options.{name}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CommandError(f"option {name!r} must be a {'integer' if kind is int else 'number'}"
                           f", got {type(value).__name__}", field=field)
    if kind is int and isinstance(value, float):
        if not value.is_integer():
            raise CommandError(f"option {name!r} must be an integer, got {value}", field=field)
        value = int(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise CommandError(f"option {name!r} must be finite, got {value}", field=field)
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        lo, hi = (int(b) if kind is int else b for b in bounds)
        raise CommandError(f"option {name!r} is {value}; allowed {lo}..{hi}", field=field)
    return kind(value)


def sampler_params(options: dict[str, Any] | None) -> dict[str, Any]:
    """llama.cpp generation parameters from Ollama ``options`` (CommandError naming the
    option for a bad value; unknown options ignored)."""
    # no num_predict: Ollama's default -1, until the context is full (llama-cpp-python's
    # own default, 16 tokens, cut every answer of ollama.chat() and ChatOllama)
    params: dict[str, Any] = {"max_tokens": None}
    for name, value in (options or {}).items():
        if value is None:
            continue
        if name in SAMPLER_OPTIONS:
            param, kind, bounds = SAMPLER_OPTIONS[name]
            params[param] = _number(name, value, kind, bounds)
        elif name == "num_predict":
            n = _number(name, value, int, (-2, 1 << 20))
            if n == 0:
                raise CommandError("option 'num_predict' is 0; allowed -1 (no limit), -2 (fill "
                                   "the context) or 1..1048576", field="options.num_predict")
            # -1 and -2: until the context is full, which is llama.cpp's max_tokens=None
            params["max_tokens"] = n if n > 0 else None
        elif name == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
                raise CommandError("option 'stop' must be a list of non-empty strings",
                                   field="options.stop")
            if len(stops) > MAX_STOP:
                raise CommandError(f"option 'stop' has {len(stops)} strings; allowed at most "
                                   f"{MAX_STOP}", field="options.stop")
            params["stop"] = stops
        elif name in LOAD_OPTIONS:
            kind = LOAD_OPTIONS[name]
            if kind is bool and not isinstance(value, bool):
                raise CommandError(f"option {name!r} must be true or false",
                                   field=f"options.{name}")
            if kind is int:
                _number(name, value, int, (-1, 1 << 24))
    return params


def num_ctx_option(options: dict[str, Any] | None) -> int | None:
    """``options.num_ctx``: the context per request to load the model with (None: absent, 0
    or negative, the model's context as it is loaded). Checked against the model when it is
    loaded (:mod:`edgepilot.serving.num_ctx`)."""
    value = (options or {}).get("num_ctx")
    if value is None:
        return None
    n = _number("num_ctx", value, int, (-1, 1 << 24))
    return n if n > 0 else None


# a Go duration as Ollama parses keep_alive ("5m", "1h30m", "300ms", "-1s")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's ``keep_alive``: seconds to stay loaded after the request; ``math.inf`` for a
    negative value (keep loaded), 0 to unload now, None when absent (the model's default)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise CommandError("keep_alive must be a duration like \"5m\", a number of seconds, "
                           "0 (unload now) or -1 (keep loaded)", field="keep_alive")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = sign * float(body)  # a bare number is seconds
        except ValueError:
            parts = _DURATION.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise CommandError(f"keep_alive {value!r} is not a duration; allowed e.g. "
                                   "\"30s\", \"5m\", \"1h30m\", a number of seconds, 0 (unload "
                                   "now) or -1 (keep loaded)", field="keep_alive") from None
            seconds = sign * sum(float(n) * _UNIT_S[u] for n, u in parts)
    else:
        raise CommandError("keep_alive must be a duration string or a number",
                           field="keep_alive")
    if not math.isfinite(seconds) or seconds < 0:
        return math.inf
    return seconds


class _Body(BaseModel):
    # fields Ollama added later (and that this daemon does not use) must not fail a request
    model_config = ConfigDict(extra="ignore")


class ToolFunction(_Body):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Body):
    type: str = "function"
    function: ToolFunction


class ToolCallFunction(_Body):
    name: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCall(_Body):
    function: ToolCallFunction


class Message(_Body):
    role: str = Field(pattern=r"^(system|user|assistant|tool)$")
    content: str | None = None
    images: list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    thinking: str | None = None


class Common(_Body):
    model: str = Field(min_length=1, max_length=128)
    stream: bool = True
    options: dict[str, Any] | None = None
    format: str | dict[str, Any] | None = None
    keep_alive: float | str | None = None
    think: bool | str | None = None
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=20)


class ChatBody(Common):
    messages: list[Message] = Field(default_factory=list, max_length=4096)
    tools: list[Tool] | None = None


class GenerateBody(Common):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[Any] | None = None


class EmbedBody(_Body):
    model: str = Field(min_length=1, max_length=128)
    input: str | list[str] = Field(default="")
    truncate: bool = True
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None
    dimensions: int | None = Field(None, ge=1)


class EmbeddingsBody(_Body):
    model: str = Field(min_length=1, max_length=128)
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None


class ShowBody(_Body):
    model: str | None = Field(None, min_length=1, max_length=128)
    name: str | None = Field(None, min_length=1, max_length=128)  # the older spelling
    verbose: bool = False


class PullBody(_Body):
    model: str | None = Field(None, min_length=1, max_length=128)
    name: str | None = Field(None, min_length=1, max_length=128)  # the older spelling
    insecure: bool = False
    stream: bool = True


def parse(cls: type[B], data: Any) -> B:
    """``data`` as ``cls``; the first validation error as a CommandError naming its field."""
    if not isinstance(data, dict):
        raise CommandError("request body must be a JSON object", field="body")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = field_of(first.get("loc", ())) or "body"
        raise CommandError(f"field '{field}': {first.get('msg')}", field=field) from None
