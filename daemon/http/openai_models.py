"""Request bodies of the OpenAI-compatible routes (:mod:`edgepilot.http.openai`), validated by
pydantic: an unknown field is a 400 naming it, and so is a value out of range."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from edgepilot.errors import CommandError
from edgepilot.http.choices import MAX_CHOICES


def _utf8(text: str) -> str:
    # JSON may carry lone surrogates ("\ud800") that no tokenizer can encode; refuse them here,
    # naming the field, instead of failing inside llama.cpp
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text must be valid Unicode; a lone surrogate "
                         f"{text[exc.start]!r} is at position {exc.start}") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: Text
    # litellm and Anthropic-style clients mark parts to cache; prefix reuse here is automatic
    cache_control: dict[str, Any] | None = Field(None, description="Accepted and ignored.")


class CallFunction(_Strict):
    name: str = Field(min_length=1, max_length=256)
    arguments: str = Field(max_length=1 << 20, description="The arguments as a JSON string.")
    # the OpenAI SDK's ``.parse()`` adds it to each call; an agent loop sends it back
    parsed_arguments: Any = Field(None, description="Accepted and ignored.")


class ToolCall(_Strict):
    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: CallFunction


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Text | list[TextPart] | None = None
    name: str | None = Field(None, max_length=256)
    tool_calls: list[ToolCall] | None = Field(None, max_length=128,
                                              description="An assistant's earlier calls.")
    tool_call_id: str | None = Field(None, max_length=256,
                                     description="The call a tool message answers.")
    # an agent loop sends an answer's message back whole (``message.model_dump()``)
    refusal: str | None = Field(None, max_length=1 << 16, description="Accepted and ignored.")
    annotations: list[Any] | None = Field(None, max_length=0, description="Accepted empty.")
    audio: None = Field(None, description="Accepted as null (no audio).")
    # the SDK's ``.parse()`` result and a reasoning model's thoughts (DeepSeek, vLLM, LiteLLM)
    parsed: Any = Field(None, description="Accepted and ignored.")
    reasoning_content: str | None = Field(None, max_length=1 << 20,
                                          description="Accepted and ignored.")
    function_call: CallFunction | None = Field(None, description="An assistant's earlier call "
                                               "in the deprecated ``functions`` form.")

    @model_validator(mode="before")
    @classmethod
    def _text_parts_only(cls, data: Any) -> Any:
        # an image part would otherwise be "Input should be a valid string": say what it is
        parts = data.get("content") if isinstance(data, dict) else None
        for j, part in enumerate(parts if isinstance(parts, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ValueError(f"content part {j} is of type {kind!r}: the models here read "
                                 "text only; allowed 'text'")
        return data

    def as_llama(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": content or ""}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and role == "tool":
            out["name"] = self.name
        return out


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str | None = Field(None, max_length=1 << 16)
    parameters: dict[str, Any] | None = Field(None, description="JSON Schema of the arguments.")
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str = Field(min_length=1, max_length=256)


class ToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = Field(None, description="Accepted and ignored.")


# sampling fields a client may send as null for "the default"
_NULLABLE = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "n", "stream",
             "logit_bias")


def _no_token_ids(value: Any) -> Any:
    """Token ids are a tokenizer's: OpenAI clients that send them (LangChain's
    OpenAIEmbeddings counts with tiktoken) mean OpenAI's, which are not this model's."""
    if isinstance(value, list) and value and not all(isinstance(v, str) for v in value):
        raise ValueError("token ids are not supported: ids are tokenizer-specific (a client "
                         "counting with tiktoken sends OpenAI's, not this model's); send text "
                         "(LangChain: OpenAIEmbeddings(check_embedding_ctx_length=False))")
    return value


# text, or what an OpenAI client may send instead: token ids, refused naming the field
Texts = Annotated[Text | list[Text] | list[int] | list[list[int]], AfterValidator(_no_token_ids)]


class Sampling(_Strict):
    model: str = Field(min_length=1, max_length=128, description="A model from /v1/models.")
    max_tokens: int | None = Field(None, ge=1, le=1 << 20)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, ge=0, le=1, description="0 keeps the most likely token only.")
    # llama.cpp's samplers, not OpenAI's: its server and vLLM take them, and local front ends
    # (Open WebUI, SillyTavern, litellm's extra_body) send them; absent: llama.cpp's defaults
    top_k: int | None = Field(None, ge=0, le=1 << 20, description="llama.cpp's top-k.")
    min_p: float | None = Field(None, ge=0, le=1, description="llama.cpp's min-p.")
    repeat_penalty: float | None = Field(None, gt=0, le=10,
                                         description="llama.cpp's repeat penalty.")
    stop: Text | list[Text] | None = Field(None, description="Up to 4 stop strings.")
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="Answers per prompt, generated one "
                   "after another (a seed: the j-th answer uses seed + j).")
    adapter: str | None = Field(
        None, min_length=1, max_length=64,
        description="A LoRA adapter of the model (its [[models]] adapters); the model name "
                    "'<model>:<adapter>' picks one too.")
    logit_bias: dict[str, float] | None = Field(
        None, max_length=1024, description="Token id (this model's tokenizer, as a string) -> "
                                           "bias in [-100, 100] added to its logit.")
    # fields of OpenAI's request that change nothing a local model generates (where an answer
    # is stored, billing tiers, cache routing, a reasoning model's budget): clients and
    # frameworks forward them from their settings, so they are accepted and ignored, as
    # llama.cpp's server and Ollama's /v1 do
    store: bool | None = Field(None, description="Accepted and ignored (nothing is stored).")
    metadata: dict[str, str] | None = Field(None, description="Accepted and ignored.")
    service_tier: str | None = Field(None, max_length=64, description="Accepted and ignored.")
    prompt_cache_key: str | None = Field(None, max_length=1024,
                                         description="Accepted and ignored (prefix reuse is "
                                                     "automatic).")
    safety_identifier: str | None = Field(None, max_length=256,
                                          description="Accepted and ignored.")
    reasoning_effort: str | None = Field(None, max_length=32,
                                         description="Accepted and ignored.")
    verbosity: str | None = Field(None, max_length=32, description="Accepted and ignored.")
    user: str | None = Field(None, max_length=256, description="Accepted and ignored.")

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if not (v is None and k in _NULLABLE)}
        return data

    def llama_params(self) -> dict[str, Any]:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        stop = [s for s in stop if s]  # "" would stop at the first token
        if len(stop) > 4:
            raise CommandError("at most 4 stop strings are allowed", field="stop")
        params: dict[str, Any] = {
            "temperature": self.temperature, "top_p": self.top_p, "stop": stop,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty}
        # absent: until end-of-sequence or a full context, as OpenAI (llama-cpp-python's own
        # default, 16 tokens, cut every answer of a client that sends no limit: LangChain's)
        params["max_tokens"] = self.max_tokens
        params.update({k: v for k, v in (("top_k", self.top_k), ("min_p", self.min_p),
                                         ("repeat_penalty", self.repeat_penalty))
                       if v is not None})
        if self.seed is not None:
            params["seed"] = self.seed
        if self.adapter is not None:
            params["adapter"] = self.adapter
        if self.logit_bias:
            params["logit_bias"] = dict(self.logit_bias)
        return params


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=1 << 20)
    response_format: dict[str, Any] | None = Field(
        None, description='{"type": "text" | "json_object" | "json_schema", "json_schema": '
                          '{"name", "schema"}}: constrained by a grammar from the schema.')
    tools: list[ToolDef] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | ToolChoice | None = None
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call; "
                                             "else an answer may make several.")
    logprobs: bool | None = Field(None, description="Each answer token's logprob.")
    top_logprobs: int | None = Field(None, ge=0, le=20,
                                     description="Alternatives per token (needs logprobs).")
    modalities: list[Literal["text"]] | None = Field(None, description="Text only.")
    # OpenAI's deprecated form of tools, still accepted by its API and sent by older clients
    functions: list[FunctionDef] | None = Field(None, max_length=128,
                                                description="Answered as message.function_call.")
    function_call: Literal["none", "auto"] | NamedFunction | None = None

    def legacy_as_tools(self) -> bool:
        """Rewrite ``functions``/``function_call`` (and the conversation's ``function_call``
        and ``function`` messages) as tools, in place; True when the request used them (its
        answer then carries ``function_call``, not ``tool_calls``)."""
        if not self.functions and self.function_call is None:
            return False
        if self.tools or self.tool_choice is not None:
            raise CommandError("give tools and tool_choice, or the deprecated functions and "
                               "function_call, not both", field="functions")
        self.tools = [ToolDef(type="function", function=f) for f in self.functions or []]
        call = self.function_call
        self.tool_choice = ToolChoice(type="function", function=call) \
            if isinstance(call, NamedFunction) else call
        last: dict[str, str] = {}  # function name -> id of its latest call
        for i, m in enumerate(self.messages):
            if m.role == "assistant" and m.function_call is not None:
                last[m.function_call.name] = last[""] = f"call_{i}"
                m.tool_calls, m.function_call = [ToolCall(id=f"call_{i}",
                                                          function=m.function_call)], None
            elif m.role == "function":
                m.role, m.tool_call_id = "tool", last.get(m.name or "", last.get(""))
        return True


class CompletionRequest(Sampling):
    prompt: Texts
    logprobs: int | None = Field(None, ge=0, le=5, description="Each answer token's logprob "
                                 "and this many alternatives.")
    # OpenAI's legacy completion fields, as clients send their defaults
    echo: Literal[False] = Field(False, description="The prompt is not echoed.")
    best_of: Literal[1] | None = Field(None, description="One candidate is generated.")
    suffix: Literal[""] | None = Field(None, description="No fill-in-the-middle.")


class EmbeddingRequest(_Strict):
    model: str = Field(min_length=1, max_length=128, description="A model from /v1/models.")
    input: Texts = Field(
        description="A text or up to 2048 texts (token ids are refused: they are tokenizer-"
                    "specific).")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: the little-endian float32 bytes, base64-encoded.")
    dimensions: int | None = Field(None, ge=1, description="Keep the first N dimensions "
                                   "(normalised to unit length again).")
    user: str | None = Field(None, max_length=256)
