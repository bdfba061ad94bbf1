"""Request bodies of the OpenAI-compatible API, as pydantic models.

Pydantic checks types and shapes (a string where a number belongs is a 400 naming the
field); ranges are checked once, by ``SamplingParams``, whose ValueError names the
parameter. ``to_sampling_params`` maps a request onto it and translates the parameter's
name back into the one the client sent (``top_logprobs``, ``max_completion_tokens``).

A field the server does not implement is refused (extra fields are forbidden): the 400
names it, so no request is silently answered as if the field were not there. Message
objects are the exception: fields a client echoes back from a previous response (``refusal``,
``annotations``, ``audio``... when null or empty) are dropped; any other value is refused.
The accepted fields are listed in the README. Types are strict (``STRICT``): ``"yes"`` is
not a boolean, ``"2"`` or ``2.0`` not an integer, ``"0.5"`` not a number (an integer is a
number).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inferpath.sampling.params import SamplingParams
from inferpath.server.protocol_extras import STRICT, ParamError, StructuredFields, logit_bias_pairs
from inferpath.server.tools import ToolFields, history_tool_calls


class StreamOptions(BaseModel):
    """``include_usage``: a last chunk with the usage (OpenAI); ``continuous_usage_stats``:
    the usage so far in every chunk (vLLM's; benchmark clients such as guidellm send it)."""

    model_config = STRICT
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingFields(StructuredFields):
    """Parameters shared by completions and chat completions."""

    model_config = STRICT

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @property
    def include_usage_in_stream(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def usage_in_every_chunk(self) -> bool:
        return bool(self.stream and self.stream_options
                    and self.stream_options.continuous_usage_stats)

    def _sampling_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "n": self.n,
            "seed": self.seed,
            "stop": self.stop,
            "stop_token_ids": tuple(self.stop_token_ids or ()),
            "ignore_eos": self.ignore_eos,
            "min_tokens": self.min_tokens,
            "skip_special_tokens": self.skip_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "logit_bias": logit_bias_pairs(self.logit_bias),
            "structured": self.structured_output(),
        }
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                     "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if value is not None:  # None: SamplingParams' default
                kwargs[name] = value
        return kwargs


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. ``prompt`` is a string, a list of strings, token ids or a
    list of token-id lists; each prompt yields ``n`` choices, indexed prompt-major."""

    prompt: Prompt
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, prompt: Prompt) -> Prompt:
        if isinstance(prompt, list) and (not prompt or any(p == [] or p == "" for p in prompt)):
            raise ValueError("prompt must not be empty (nor hold an empty prompt)")
        if prompt == "":
            raise ValueError("prompt must not be empty")
        return prompt

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: each a string or a list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]

    def to_sampling_params(self) -> SamplingParams:
        if self.suffix:
            raise ParamError("suffix is not supported", "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise ParamError(f"best_of ({self.best_of}) must equal n ({self.n}): choosing the "
                             "best of several samples is not supported", "best_of")
        kwargs = self._sampling_kwargs()
        kwargs["max_tokens"] = self.max_tokens
        kwargs["logprobs"] = self.logprobs
        if self.echo and self.logprobs is not None:  # the prompt's logprobs too, as vLLM
            kwargs["prompt_logprobs"] = self.logprobs
        return _build(kwargs, renames={})


class ContentPart(BaseModel):
    model_config = STRICT
    type: str
    text: str | None = None


class ToolCallFunction(BaseModel):
    model_config = STRICT
    name: str
    arguments: str | dict[str, Any]


class ToolCallMessage(BaseModel):
    """A tool call of an assistant message in the history."""

    model_config = STRICT
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # see _no_unknown_values
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallMessage] | None = None
    tool_call_id: str | None = None
    # an earlier answer's reasoning, as this server (llama.cpp, vLLM) returned it
    reasoning_content: str | None = None
    reasoning: str | None = None

    @model_validator(mode="after")
    def _no_unknown_values(self) -> "ChatMessage":
        for key, value in (self.model_extra or {}).items():
            if value not in (None, "", [], {}):
                raise ValueError(f"message field {key!r} is not supported")
        return self

    def text(self) -> str:
        """The message's text: text parts joined; other part types are refused."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ParamError(f"content part of type {part.type!r} is not supported; "
                                 "only 'text' parts are", "messages")
        return "".join(part.text or "" for part in self.content)


class ChatCompletionRequest(_SamplingFields, ToolFields):
    """POST /v1/chat/completions. ``max_completion_tokens`` wins over ``max_tokens``;
    with neither, generation runs to EOS or the context limit."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    # reasoning models (server/reasoning.py): vLLM's include_reasoning, OpenAI's
    # reasoning_effort (to templates that read it), vLLM's chat_template_kwargs
    include_reasoning: bool = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def chat_messages(self) -> list[dict[str, str]]:
        """Messages as plain dicts for the tokenizer's chat template."""
        return messages_as_dicts(self.messages)

    def to_sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise ParamError("top_logprobs requires logprobs to be true", "top_logprobs")
        kwargs = self._sampling_kwargs()
        use_completion = self.max_completion_tokens is not None
        kwargs["max_tokens"] = self.max_completion_tokens if use_completion else self.max_tokens
        kwargs["logprobs"] = (self.top_logprobs or 0) if self.logprobs else None
        renames = {"logprobs": "top_logprobs"}
        if use_completion:
            renames["max_tokens"] = "max_completion_tokens"
        return _build(kwargs, renames)


class TokenizeRequest(BaseModel):
    """POST /tokenize: a prompt, or chat messages rendered with the chat template."""

    model_config = STRICT
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    model_config = STRICT
    model: str | None = None
    tokens: list[int]


def messages_as_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them (``developer`` is OpenAI's new name
    for ``system``; tool calls carry their arguments as objects)."""
    rendered: list[dict[str, Any]] = []
    for m in messages:
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                                   "content": m.text()}
        if m.tool_calls:
            message["tool_calls"] = history_tool_calls(m.tool_calls)
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            message["name"] = m.name
        reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
        if reasoning is not None and m.role == "assistant":
            message["reasoning_content"] = reasoning  # reasoning.history_reasoning renames it
        elif reasoning is not None:
            raise ParamError(f"reasoning_content is only for assistant messages, not {m.role!r}",
                             "messages")
        rendered.append(message)
    return rendered


def _build(kwargs: dict[str, Any], renames: dict[str, str]) -> SamplingParams:
    """SamplingParams(**kwargs), its ValueError turned into a ParamError naming the field
    as the client spelled it (SamplingParams' messages start with the parameter name)."""
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:
        message = str(exc)
        name = message.split(" ", 1)[0]
        if name in kwargs:
            client_name = renames.get(name, name)
            if client_name != name:
                message = client_name + message[len(name):]
            raise ParamError(message, client_name) from None
        raise ParamError(message, None) from None
