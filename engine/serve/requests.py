"""The request bodies, as pydantic models: the one place a request's fields are checked.

A field we do not support (n > 1, logprobs, tools, ...) is refused by name, never ignored; an
unknown field is refused too (as OpenAI's own API does). Ranges come from the engine's settings,
so the server, the command line and the window take the same values.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.decode.prompts import check_text
from engine.decode.settings import MAX_TEMPERATURE, MAX_TOKENS_LIMIT
from engine.errors import SettingsError

MAX_STOPS = 16
MAX_SEED = 2**63 - 1


def _text(value: str) -> str:
    try:
        check_text(value)
    except SettingsError as exc:
        raise ValueError(str(exc).replace("the prompt holds", "the text holds")) from None
    return value


Text = Annotated[str, AfterValidator(_text)]


def _some(messages: list) -> list:
    if not messages:
        raise ValueError("the conversation is empty: give at least one message")
    return messages


def _stops(stops: list[str], what: str) -> list[str]:
    if len(stops) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} {what}s")
    if any(not s for s in stops):
        raise ValueError(f"an empty {what} matches nothing; give the text to stop at")
    return stops


def _unsupported(name: str, what: str) -> str:
    return f"'{name}' is not supported by this server ({what}); leave it out."


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sampling(_Body):
    """What every endpoint samples with; the defaults are `generate`'s (greedy)."""
    model: Optional[str] = None  # echoed, never loaded: the pair is chosen when the server starts
    stream: bool = False
    temperature: Optional[float] = Field(None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=0)
    min_p: Optional[float] = Field(None, ge=0.0, lt=1.0)
    seed: Optional[int] = Field(None, ge=0, le=MAX_SEED)
    max_tokens: Optional[int] = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    metadata: Optional[dict[str, Any]] = None  # accepted and ignored: it asks nothing of the run


class _OpenAI(Sampling):
    stop: Union[Text, list[Text], None] = Field(None, validate_default=True)
    stream_options: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    n: Optional[int] = None
    logprobs: Any = None
    top_logprobs: Optional[int] = None
    logit_bias: Optional[dict[str, Any]] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    store: Optional[bool] = None
    service_tier: Optional[str] = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        return _stops([v] if isinstance(v, str) else (v or []), "stop string")

    @model_validator(mode="after")
    def _refused(self):
        if self.n not in (None, 1):
            raise ValueError(_unsupported("n", "one choice per request; send n = 1"))
        if self.logprobs not in (None, False, 0):
            raise ValueError(_unsupported("logprobs", "no log probabilities are returned"))
        if self.top_logprobs:
            raise ValueError(_unsupported("top_logprobs", "no log probabilities are returned"))
        if self.logit_bias:
            raise ValueError(_unsupported("logit_bias", "sampling takes no token biases"))
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ValueError(_unsupported(name, "sampling takes no penalties"))
        options = self.stream_options or {}
        if set(options) - {"include_usage"}:
            raise ValueError(f"stream_options: only 'include_usage' is known, not {sorted(set(options) - {'include_usage'})}")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and (self.stream_options or {}).get("include_usage"))


def joined(content) -> str:
    """A message's content as one text: a string as it is, text parts one after another."""
    return content if isinstance(content, str) else "".join(p.text for p in content)


class TextPart(_Body):
    type: Literal["text"]
    text: Text


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[Text, list[TextPart]]
    name: Optional[str] = None

    def text(self) -> str:
        return joined(self.content)


class ChatRequest(_OpenAI):
    """POST /v1/chat/completions."""
    messages: Annotated[list[ChatMessage], AfterValidator(_some)]
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    tools: Optional[list[Any]] = None
    tool_choice: Any = None
    functions: Optional[list[Any]] = None
    function_call: Any = None
    parallel_tool_calls: Optional[bool] = None
    response_format: Optional[dict[str, Any]] = None

    @model_validator(mode="after")
    def _no_tools(self):
        for name in ("tools", "functions"):
            if getattr(self, name):
                raise ValueError(_unsupported(name, "no tool calls"))
        if self.tool_choice not in (None, "none") or self.function_call not in (None, "none"):
            raise ValueError(_unsupported("tool_choice", "no tool calls"))
        if self.response_format not in (None, {"type": "text"}):
            raise ValueError(_unsupported("response_format", "text replies only"))
        if self.max_tokens and self.max_completion_tokens and self.max_tokens != self.max_completion_tokens:
            raise ValueError("max_tokens and max_completion_tokens disagree; give one")
        return self

    @property
    def token_limit(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens

    def conversation(self) -> list[dict[str, str]]:
        """The messages as the chat template takes them (OpenAI's 'developer' is a system message)."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(_OpenAI):
    """POST /v1/completions: the prompt as raw text, continued."""
    prompt: Union[Text, list[Text]]
    echo: Optional[bool] = None
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    @field_validator("prompt")
    @classmethod
    def _one(cls, v):
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError(f"one prompt per request, not a list of {len(v)}")
            v = v[0]
        if not v:
            raise ValueError("the prompt is empty; give at least one character")
        return v

    @model_validator(mode="after")
    def _plain(self):
        if self.echo:
            raise ValueError(_unsupported("echo", "the reply is the new text alone"))
        if self.suffix:
            raise ValueError(_unsupported("suffix", "no fill-in-the-middle"))
        if self.best_of not in (None, 1):
            raise ValueError(_unsupported("best_of", "one sample per request"))
        return self

    @property
    def token_limit(self) -> Optional[int]:
        return self.max_tokens


class AnthropicText(_Body):
    type: Literal["text"]
    text: Text
    cache_control: Optional[dict[str, Any]] = None  # a hint to Anthropic's cache; ours reuses prefixes anyway


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: Union[Text, list[AnthropicText]]

    def text(self) -> str:
        return joined(self.content)


class MessagesRequest(Sampling):
    """POST /v1/messages (Anthropic Messages)."""
    max_tokens: int = Field(..., ge=1, le=MAX_TOKENS_LIMIT)
    messages: Annotated[list[AnthropicMessage], AfterValidator(_some)]
    system: Union[Text, list[AnthropicText], None] = None
    stop_sequences: Optional[list[Text]] = None
    tools: Optional[list[Any]] = None
    tool_choice: Any = None
    thinking: Optional[dict[str, Any]] = None

    @field_validator("stop_sequences")
    @classmethod
    def _stop_list(cls, v):
        return _stops(v or [], "stop sequence")

    @model_validator(mode="after")
    def _no_tools(self):
        if self.tools or self.tool_choice is not None:
            raise ValueError(_unsupported("tools", "no tool use"))
        if self.thinking not in (None, {"type": "disabled"}):
            raise ValueError(_unsupported("thinking", "no extended thinking"))
        return self

    @property
    def token_limit(self) -> int:
        return self.max_tokens

    @property
    def stop(self) -> list[str]:
        return self.stop_sequences or []

    def conversation(self) -> list[dict[str, str]]:
        system = joined(self.system or [])
        head = [{"role": "system", "content": system}] if system else []
        return head + [{"role": m.role, "content": m.text()} for m in self.messages]
