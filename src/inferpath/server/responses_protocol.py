"""The request body of ``POST /v1/responses`` and its translation onto the chat path.

Fields, as the README's Responses section lists them:

- implemented: ``model``, ``input`` (a string, or items: ``message`` with ``input_text`` /
  ``output_text`` parts, ``function_call``, ``function_call_output``), ``instructions``,
  ``max_output_tokens``, ``temperature``, ``top_p``, ``top_k``, ``min_p``,
  ``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``, ``seed``, ``stop``,
  ``tools`` (``function``, and ``namespace`` groups of functions), ``tool_choice``,
  ``parallel_tool_calls``, ``text.format`` (``text``, ``json_object``, ``json_schema``:
  the grammar engine enforces them), ``stream``, ``store``, ``previous_response_id``,
  ``metadata``, ``user``, ``safety_identifier`` (echoed), ``truncation: "disabled"``,
  ``background: false``;
- accepted with a warning (``NOTED_FIELDS``; the response's ``warnings`` list and a log
  line say each time): the hosted tools only OpenAI's servers run (``HOSTED_TOOL_TYPES``:
  not offered to the model), ``client_metadata``, ``prompt_cache_key`` (the prefix cache
  needs no key), ``include``, ``service_tier``, ``prompt_cache_retention``,
  ``max_tool_calls``, ``stream_options``, ``text.verbosity``, ``reasoning.summary`` (the
  reasoning item holds the whole text, no summary), ``reasoning.effort`` for a template that
  takes none, and ``reasoning`` input items that hold only ``encrypted_content``;
- reasoning (server/reasoning.py): ``reasoning.effort`` goes to a chat template that reads
  ``reasoning_effort`` (gpt-oss's); the answer's reasoning comes back as a ``reasoning``
  output item (``content: [{"type": "reasoning_text"}]``); a ``reasoning`` input item's
  text is given to the next assistant turn as its earlier reasoning;
- anything else is a 400 naming it (unknown fields, item types, content part types).

Namespace functions reach the model as ``namespace.name`` (a dot is not allowed in an
OpenAI function name, so the flat name cannot collide with a plain function); calls come
back split into ``namespace`` and ``name``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferpath.server.protocol import _build
from inferpath.server.protocol_extras import STRICT, ParamError
from inferpath.server.tools import FunctionDefinition
from inferpath.structured import GrammarError, StructuredOutput
from inferpath.sampling.params import SamplingParams

#: Tools that OpenAI's servers execute themselves: accepted, never offered to the model.
HOSTED_TOOL_TYPES = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
    "file_search", "computer_use_preview", "computer_use", "computer", "code_interpreter",
    "image_generation", "mcp", "local_shell", "tool_search",
})
#: Fields accepted without effect, and what the warning says about each.
NOTED_FIELDS = {
    "client_metadata": "client_metadata is accepted and not used",
    "prompt_cache_key": "prompt_cache_key is not needed: the prefix cache reuses any shared "
                        "prompt prefix by itself",
    "include": "include is accepted; none of its extra outputs (reasoning.encrypted_content, "
               "logprobs...) are produced",
    "service_tier": "service_tier is accepted and not used",
    "prompt_cache_retention": "prompt_cache_retention is accepted; cached prefixes live as "
                              "long as their KV blocks are not needed",
    "max_tool_calls": "max_tool_calls limits hosted tool calls, which this server does not run",
    "stream_options": "stream_options is accepted and not used",
}
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
_FUNCTION_KEYS = {"type", "name", "description", "parameters", "strict"}


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None  # always strict here: the grammar enforces the schema


class TextConfig(BaseModel):
    model_config = STRICT
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(BaseModel):
    """POST /v1/responses (see the module docstring for what each field does)."""

    model_config = STRICT
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    truncation: Literal["disabled"] | None = None
    background: Literal[False] | None = None
    # accepted without effect: NOTED_FIELDS
    client_metadata: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = None
    prompt_cache_retention: str | None = None
    max_tool_calls: int | None = None
    stream_options: dict[str, Any] | None = None

    def warnings(self) -> list[str]:
        notes = [note for name, note in NOTED_FIELDS.items() if getattr(self, name) is not None]
        if self.text is not None and self.text.verbosity is not None:
            notes.append("text.verbosity is accepted and not used")
        if self.reasoning is not None and self.reasoning.get("summary") is not None:
            notes.append("reasoning.summary: no summaries are written; the reasoning item's "
                         "content holds the whole reasoning text")
        return notes

    def reasoning_effort(self) -> str | None:
        """``reasoning.effort`` (ParamError for a reasoning field OpenAI does not define)."""
        if self.reasoning is None:
            return None
        unknown = sorted(set(self.reasoning) - {"effort", "summary", "generate_summary"})
        if unknown:
            raise ParamError(f"reasoning.{unknown[0]} is not supported", f"reasoning.{unknown[0]}")
        effort = self.reasoning.get("effort")
        if effort is not None and effort not in REASONING_EFFORTS:
            raise ParamError(f"reasoning.effort must be one of {', '.join(REASONING_EFFORTS)}, "
                             f"got {effort!r}", "reasoning.effort")
        return effort

    def to_sampling_params(self) -> SamplingParams:
        kwargs: dict[str, Any] = {"max_tokens": self.max_output_tokens, "seed": self.seed,
                                  "stop": self.stop, "structured": self.structured_output()}
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                     "frequency_penalty", "repetition_penalty"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return _build(kwargs, {"max_tokens": "max_output_tokens"})

    def structured_output(self) -> StructuredOutput | None:
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutput("json_object", param="text.format")
        if fmt.json_schema is None:
            raise ParamError("text.format of type json_schema needs a schema", "text.format.schema")
        try:
            return StructuredOutput.json_schema(fmt.json_schema, "text.format")
        except GrammarError as exc:
            raise ParamError(str(exc), "text.format") from None


@dataclass
class ResponseTools:
    """The request's tools as chat functions (flat names), and what was left out."""

    functions: list[FunctionDefinition] = field(default_factory=list)
    names: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # flat -> (ns, name)
    ignored: list[str] = field(default_factory=list)  # hosted tool types, in request order

    def warnings(self) -> list[str]:
        return [f"tool {kind!r} runs only on OpenAI's servers; it was not offered to the model"
                for kind in self.ignored]

    def chat_tool_choice(self, tool_choice: Any) -> Any:
        """``tool_choice`` as the chat route spells it."""
        if tool_choice is None or isinstance(tool_choice, str):
            return tool_choice
        if tool_choice.get("type") != "function" or not isinstance(tool_choice.get("name"), str):
            raise ParamError(f"tool_choice {json.dumps(tool_choice)} is not supported: use "
                             "'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}",
                             "tool_choice")
        namespace = tool_choice.get("namespace")
        name = f"{namespace}.{tool_choice['name']}" if namespace else tool_choice["name"]
        return {"type": "function", "function": {"name": name}}

    def split(self, flat_name: str) -> tuple[str | None, str]:
        return self.names.get(flat_name, (None, flat_name))


def response_tools(tools: list[dict[str, Any]] | None) -> ResponseTools:
    result = ResponseTools()
    for i, tool in enumerate(tools or ()):
        kind = tool.get("type")
        if kind in HOSTED_TOOL_TYPES:
            result.ignored.append(kind)
        elif kind == "function":
            _add_function(result, tool, None, f"tools[{i}]")
        elif kind == "namespace":
            unknown = set(tool) - {"type", "name", "description", "tools"}
            if unknown or not isinstance(tool.get("name"), str):
                raise ParamError(f"tools[{i}]: a namespace has a name, a description and tools; "
                                 f"got fields {sorted(tool)}", f"tools[{i}]")
            for j, inner in enumerate(tool.get("tools") or ()):
                if inner.get("type") != "function":
                    raise ParamError(f"tools[{i}].tools[{j}] has type {inner.get('type')!r}; only "
                                     "functions are supported in a namespace",
                                     f"tools[{i}].tools[{j}].type")
                _add_function(result, inner, tool["name"], f"tools[{i}].tools[{j}]")
        else:
            raise ParamError(f"tools[{i}] has type {kind!r}, which is not supported (function, "
                             "namespace, and the hosted tools "
                             f"{', '.join(sorted(HOSTED_TOOL_TYPES))} are accepted)",
                             f"tools[{i}].type")
    return result


def _add_function(result: ResponseTools, tool: dict[str, Any], namespace: str | None,
                  where: str) -> None:
    unknown = sorted(key for key in set(tool) - _FUNCTION_KEYS if tool[key] not in (None, False))
    if unknown:
        raise ParamError(f"{where}.{unknown[0]} is not supported", f"{where}.{unknown[0]}")
    try:
        function = FunctionDefinition.model_validate({k: v for k, v in tool.items() if k != "type"})
    except ValueError as exc:
        raise ParamError(f"{where} is not a valid function tool: {exc}", where) from None
    flat = f"{namespace}.{function.name}" if namespace else function.name
    result.names[flat] = (namespace, function.name)
    result.functions.append(function.model_copy(update={"name": flat}))
