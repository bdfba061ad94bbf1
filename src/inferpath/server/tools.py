"""Tool calling: the request's tools, the grammar that enforces ``tool_choice``, and the
parsers that turn the model's tool-call syntax back into OpenAI ``tool_calls``.

The tools reach the model through its own chat template (the ``tools`` variable), and the
model answers in the syntax it was trained on (``TOOL_FORMATS``):

- ``hermes`` (Hermes, Qwen2.5, Qwen3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call; text before the first block is the message's content. Small models
  (Qwen2.5-Coder 0.5B/1.5B) often write the same JSON bare or in a ```json fence instead:
  an answer that is exactly one such object, naming one of the offered tools with an
  object of arguments, is read as that call (``_parse_bare_call``); anything else stays text.
  In every syntax the arguments may also be JSON text of an object (OpenAI's wire spelling,
  which Qwen2.5-Coder-0.5B writes too; llama.cpp reads it so).
- ``llama3_json`` (Llama-3.1/3.2): the whole answer is ``{"name": ..., "parameters": {...}}``
  (optionally after ``<|python_tag|>``; several calls separated by ``;``).
- ``llama4`` (Llama 4): a pythonic list ``[name(key=value, ...)]``, optionally inside
  ``<|python_start|>``…``<|python_end|>`` (tool_pythonic.py), or llama3_json's JSON.
- ``harmony`` (gpt-oss): messages sent ``to=functions.NAME``; parsed with the reasoning
  channels by reasoning_harmony.py, not here.

The syntax is chosen from the template (``tool_format``: harmony channels; ``<tool_call>``:
hermes; Llama 4's ``<|header_start|>`` / ``<|python_start|>``: llama4; ``<|python_tag|>``
or ``"parameters"``: llama3_json; else hermes). ``tool_choice`` ``"required"`` or a named
function is enforced by a grammar in that syntax (llguidance Lark with ``%json`` schemas):
the name is one of the tools (or the named one), the arguments valid against its
``parameters`` schema; ``parallel_tool_calls: false`` allows one call only.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from inferpath.server.protocol_extras import STRICT, ParamError
from inferpath.structured import StructuredOutput
from inferpath.structured.schema import close_objects

#: JSON inside tool calls is compact, like structured output (see structured/compiler.py).
_COMPACT = {"whitespace_flexible": False}


class FunctionDefinition(BaseModel):
    model_config = STRICT
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # always strict here: the grammar enforces the schema


class ToolDefinition(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionName


class ToolFields(BaseModel):
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a chat request."""

    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def tools_for_template(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template's ``tools`` variable (None with tool_choice none)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]

    def tool_names(self) -> tuple[str, ...]:
        """The names of the tools offered to the model (none with tool_choice none)."""
        if not self.tools or self.tool_choice == "none":
            return ()
        return tuple(tool.function.name for tool in self.tools)

    def forced_tools(self) -> list[FunctionDefinition] | None:
        """The functions the output must call (required: any tool; named: that one), or
        None when the model may answer freely. ParamError for an unknown name."""
        if self.tool_choice is not None and not self.tools and self.tool_choice != "none":
            raise ParamError("tool_choice needs tools", "tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.name
            named = [t.function for t in self.tools or () if t.function.name == name]
            if not named:
                raise ParamError(f"tool_choice names function {name!r}, which is not in tools",
                                 "tool_choice")
            return named
        if self.tool_choice == "required":
            return [t.function for t in self.tools or ()]
        return None

    @property
    def parses_tool_calls(self) -> bool:
        """True when the output may hold tool calls (tools given, tool_choice not none)."""
        return bool(self.tools) and self.tool_choice != "none"


#: The tool-call syntaxes and what in a chat template marks each, in the order checked.
TOOL_FORMATS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("harmony", ("<|channel|>",)),
    ("hermes", ("<tool_call>",)),
    ("llama4", ("<|header_start|>", "<|python_start|>")),
    ("llama3_json", ("<|python_tag|>", '"parameters"')),
)


def tool_format(chat_template: str | None) -> str:
    """The tool-call syntax of a chat template (``TOOL_FORMATS``; hermes if none marks it)."""
    template = chat_template or ""
    for fmt, marks in TOOL_FORMATS:
        if any(mark in template for mark in marks):
            return fmt
    return "hermes"


def tool_call_grammar(functions: list[FunctionDefinition], fmt: str, parallel: bool) -> StructuredOutput:
    """A grammar whose every output is a well-formed call (or calls, with ``parallel``) of
    one of ``functions``, in the syntax ``fmt``, arguments valid against their schemas
    (Llama 4: its JSON form). ParamError for harmony, whose calls need control tokens."""
    if fmt == "harmony":
        raise ParamError("tool_choice 'required' or a named function is not supported for "
                         "gpt-oss's harmony format (its calls are written with control tokens "
                         "the grammar cannot force); use 'auto'", "tool_choice")
    fmt = "llama3_json" if fmt == "llama4" else fmt
    arguments_key = "parameters" if fmt == "llama3_json" else "arguments"
    calls = [{"type": "object",
              "properties": {"name": {"const": f.name},
                             arguments_key: close_objects(f.parameters or {"type": "object"})},
              "required": ["name", arguments_key], "additionalProperties": False}
             for f in functions]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = {**schema, "x-guidance": _COMPACT}
    if fmt == "llama3_json":
        call = f"%json {json.dumps(schema)}"
        rule = 'call ("; " call)*' if parallel else "call"
    else:
        call = f'"<tool_call>\\n" %json {json.dumps(schema)} "\\n</tool_call>"'
        rule = 'call ("\\n" call)*' if parallel else "call"
    return StructuredOutput("grammar", f"start: {rule}\ncall: {call}\n", param="tool_choice")


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call = {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


def parse_tool_calls(text: str, fmt: str, tool_names: tuple[str, ...] = ()) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a finished output. Text that is not a well-formed call stays
    content (an ``auto`` answer may be plain text). Harmony calls come from the reasoning
    parser: here its text is content. ``tool_names``: the offered tools, which a hermes
    answer may call with bare (or fenced) JSON."""
    if fmt == "llama4":
        from inferpath.server.tool_pythonic import parse_pythonic
        return parse_pythonic(text) or _parse_llama3_json(text)
    if fmt == "llama3_json":
        return _parse_llama3_json(text)
    if fmt == "harmony":
        return text, []
    content, calls = _parse_hermes(text)
    if not calls and tool_names:
        bare = _parse_bare_call(text, tool_names)
        if bare is not None:
            return "", [bare]
    return content, calls


def bare_json_body(text: str) -> str | None:
    """The JSON of an answer that is one object, bare or in a ```json (or plain ```)
    fence; None otherwise."""
    body = text.strip()
    if body.startswith("```"):
        first_line, _, rest = body.partition("\n")
        if first_line.strip("`").strip() not in ("", "json") or not rest.rstrip().endswith("```"):
            return None
        body = rest.rstrip()[:-3].strip()
    return body if body.startswith("{") and body.endswith("}") else None


def _parse_bare_call(text: str, tool_names: tuple[str, ...]) -> ToolCall | None:
    body = bare_json_body(text)
    call = _call_from_json(body, "arguments") if body is not None else None
    return call if call is not None and call.name in tool_names else None


def _call_from_json(raw: str, arguments_key: str) -> ToolCall | None:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, value.get("arguments", value.get("parameters", {})))
    if isinstance(arguments, str):  # OpenAI's own spelling: the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    start_tag, end_tag = "<tool_call>", "</tool_call>"
    first = text.find(start_tag)
    if first < 0:
        return text, []
    calls: list[ToolCall] = []
    position = first
    while (start := text.find(start_tag, position)) >= 0:
        end = text.find(end_tag, start)
        body = text[start + len(start_tag):end if end >= 0 else len(text)]
        call = _call_from_json(body.strip(), "arguments")
        if call is None:
            return text, []  # malformed: leave it as text rather than guess
        calls.append(call)
        if end < 0:
            break
        position = end + len(end_tag)
    return text[:first].rstrip(), calls


def _parse_llama3_json(text: str) -> tuple[str, list[ToolCall]]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, []
    calls = []
    for part in _split_top_level(body, ";"):
        call = _call_from_json(part.strip(), "parameters")
        if call is None:
            return text, []
        calls.append(call)
    return "", calls


def _split_top_level(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside JSON strings and brackets."""
    parts, depth, in_string, escaped, start = [], 0, False, False, 0
    for i, ch in enumerate(text):
        if in_string:
            escaped = not escaped and ch == "\\"
            if ch == '"' and not escaped:
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def history_tool_calls(tool_calls: list[Any]) -> list[dict[str, Any]]:
    """Assistant ``tool_calls`` of the history as templates expect them: arguments as an
    object (Qwen2.5's and Llama-3.1's templates apply ``tojson`` to them)."""
    rendered = []
    for call in tool_calls:
        arguments: Any = call.function.arguments
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            raise ParamError(f"tool call {call.id!r} has arguments that are not JSON",
                             "messages") from None
        rendered.append({"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": arguments}})
    return rendered
