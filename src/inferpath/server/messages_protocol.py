"""The request body of Anthropic's ``POST /v1/messages`` and its translation onto chat.

Fields:

- implemented: ``model``, ``messages`` (roles user / assistant, and system in the middle
  of a conversation as Claude Code sends it; content a string or
  blocks ``text``, ``tool_use``, ``tool_result``), ``system`` (a string or text blocks),
  ``max_tokens`` (required), ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``,
  ``stream``, ``tools`` (``name``, ``description``, ``input_schema``), ``tool_choice``
  (``auto``, ``any``, ``tool`` with ``name``, ``none``; ``disable_parallel_tool_use``):
  ``any`` and ``tool`` are enforced by the grammar of tools.py; ``output_config.format``
  (``json_schema``: enforced by the grammar engine);
- reasoning (server/reasoning.py): the model's reasoning comes back as a ``thinking``
  block (``signature`` empty: nothing is signed) before the text, streamed as
  ``thinking_delta``; ``thinking: {"type": "disabled"}`` drops it and sets the template's
  ``enable_thinking`` false where the template reads it (``enabled`` / ``adaptive`` set it
  true); ``thinking`` blocks of earlier assistant turns are given to the template as
  those turns' reasoning;
- accepted without effect, logged: ``metadata``, ``thinking.budget_tokens`` (not
  enforced), ``service_tier``, ``speed``, ``inference_geo``,
  ``output_config.effort``, ``context_management`` with ``clear_thinking_*`` edits only
  (no thinking is kept to clear), ``cache_control`` (top level, or on any block or tool: the
  prefix cache reuses shared prefixes by itself), and ``redacted_thinking`` blocks;
- anything else is a 400 naming it (unknown fields, block types, server tools).

A user message's ``tool_result`` blocks become chat ``tool`` messages (in order, before
the message's text; ``is_error`` as the prefix ``Error: ``, since chat templates have no
error flag); an assistant's ``tool_use`` blocks become its ``tool_calls``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from inferpath.sampling.params import SamplingParams
from inferpath.server.protocol import _build
from inferpath.server.protocol_extras import STRICT, ParamError
from inferpath.server.tools import FunctionDefinition
from inferpath.structured import GrammarError, StructuredOutput

#: Block fields accepted and not used.
_IGNORED_BLOCK_KEYS = {"cache_control", "citations"}
_BLOCK_KEYS = {
    "text": {"type", "text"},
    "tool_use": {"type", "id", "name", "input"},
    "tool_result": {"type", "tool_use_id", "content", "is_error"},
    "thinking": {"type", "thinking", "signature"},
    "redacted_thinking": {"type", "data"},
}


class AnthropicMessage(BaseModel):
    model_config = STRICT
    role: Literal["user", "assistant", "system"]  # system: mid-conversation (Claude Code)
    content: str | list[dict[str, Any]]


class AnthropicTool(BaseModel):
    model_config = STRICT
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None


class AnthropicToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class OutputFormat(BaseModel):
    model_config = STRICT
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = STRICT
    effort: str | None = None
    format: OutputFormat | None = None


class MessagesRequest(BaseModel):
    """POST /v1/messages (and, without max_tokens, /v1/messages/count_tokens)."""

    model_config = STRICT
    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    output_config: OutputConfig | None = None
    # accepted without effect (logged)
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    service_tier: str | None = None
    speed: str | None = None
    inference_geo: str | None = None
    cache_control: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None

    def notes(self) -> list[str]:
        notes = [f"{name} is accepted and not used"
                 for name in ("metadata", "service_tier", "speed", "inference_geo", "cache_control")
                 if getattr(self, name) is not None]
        if self.context_management is not None:
            edits = self.context_management.get("edits")
            kinds = [e.get("type") if isinstance(e, dict) else None for e in edits or ()]
            if set(self.context_management) != {"edits"} or not all(
                    isinstance(k, str) and k.startswith("clear_thinking_") for k in kinds):
                raise ParamError("context_management is supported only with clear_thinking "
                                 f"edits (no thinking is kept here to clear); got {kinds}",
                                 "context_management")
            notes.append("context_management: there is no thinking to clear")
        if self.output_config is not None and self.output_config.effort is not None:
            notes.append("output_config.effort is accepted and not used")
        if self.thinking is not None and self.thinking.get("budget_tokens") is not None:
            notes.append("thinking.budget_tokens is not enforced: max_tokens bounds thinking "
                         "and answer together")
        return notes

    def thinking_mode(self) -> str | None:
        """``enabled``, ``disabled`` or None (not sent); ParamError for another shape."""
        if self.thinking is None:
            return None
        kind = self.thinking.get("type")
        unknown = sorted(set(self.thinking) - {"type", "budget_tokens", "display"})
        if unknown:
            raise ParamError(f"thinking.{unknown[0]} is not supported", f"thinking.{unknown[0]}")
        if kind not in ("enabled", "disabled", "adaptive"):
            raise ParamError(f"thinking.type must be enabled, disabled or adaptive, got {kind!r}",
                             "thinking.type")
        budget = self.thinking.get("budget_tokens")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
            raise ParamError(f"thinking.budget_tokens must be a positive integer, got {budget!r}",
                             "thinking.budget_tokens")
        return "disabled" if kind == "disabled" else "enabled"

    def to_sampling_params(self) -> SamplingParams:
        if self.max_tokens is None:
            raise ParamError("max_tokens is required", "max_tokens")
        kwargs: dict[str, Any] = {"max_tokens": self.max_tokens, "stop": self.stop_sequences,
                                  "structured": self.structured_output()}
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return _build(kwargs, {"stop": "stop_sequences"})

    def structured_output(self) -> StructuredOutput | None:
        fmt = self.output_config.format if self.output_config is not None else None
        if fmt is None:
            return None
        try:
            return StructuredOutput.json_schema(fmt.json_schema, "output_config.format")
        except GrammarError as exc:
            raise ParamError(str(exc), "output_config.format") from None

    def functions(self) -> list[FunctionDefinition]:
        return [FunctionDefinition(name=t.name, description=t.description,
                                   parameters=t.input_schema) for t in self.tools or ()]

    def chat_tool_choice(self) -> tuple[Any, bool | None]:
        """(tool_choice as chat spells it, parallel_tool_calls)."""
        choice = self.tool_choice
        if choice is None:
            return None, None
        parallel = None if choice.disable_parallel_tool_use is None else not choice.disable_parallel_tool_use
        if choice.type == "tool":
            if choice.name is None:
                raise ParamError("tool_choice of type tool needs a name", "tool_choice.name")
            return {"type": "function", "function": {"name": choice.name}}, parallel
        return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel

    def chat_messages(self) -> tuple[list[dict[str, Any]], list[str]]:
        """(chat messages for the template, notes on what was accepted without effect)."""
        notes: list[str] = []
        messages: list[dict[str, Any]] = []
        if self.system is not None:
            system = self.system if isinstance(self.system, str) else \
                _text_blocks(self.system, "system", notes)
            messages.append({"role": "system", "content": system})
        for i, message in enumerate(self.messages):
            where = f"messages[{i}].content"
            blocks = [{"type": "text", "text": message.content}] \
                if isinstance(message.content, str) else message.content
            texts, calls, results, thinking = [], [], [], []
            for j, block in enumerate(blocks):
                kind = _check_block(block, f"{where}[{j}]", notes)
                if kind == "text":
                    texts.append(block["text"])
                elif kind == "tool_use" and message.role == "assistant":
                    if not isinstance(block.get("input"), dict):
                        raise ParamError(f"{where}[{j}].input must be an object", f"{where}[{j}].input")
                    calls.append({"id": block["id"], "type": "function",
                                  "function": {"name": block["name"], "arguments": block["input"]}})
                elif kind == "tool_result" and message.role == "user":
                    content = block.get("content")
                    if not isinstance(content, str):
                        content = _text_blocks(content or [], f"{where}[{j}].content", notes)
                    if block.get("is_error"):  # templates have no error flag: say it in words
                        content = f"Error: {content}"
                    results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                                    "content": content})
                elif kind == "thinking" and message.role == "assistant":
                    if not isinstance(block["thinking"], str):
                        raise ParamError(f"{where}[{j}].thinking must be a string",
                                         f"{where}[{j}].thinking")
                    thinking.append(block["thinking"])
                elif kind in ("tool_use", "tool_result"):
                    raise ParamError(f"{where}[{j}] is a {kind} block in a {message.role} message",
                                     f"{where}[{j}].type")
                else:
                    notes.append(f"{where}[{j}] is a {kind} block; it is not shown to the model")
            messages += results
            if texts or calls or not results:
                chat: dict[str, Any] = {"role": message.role, "content": "".join(texts)}
                if calls:
                    chat["tool_calls"] = calls
                if thinking:  # the template shows it where it shows earlier reasoning
                    chat["reasoning_content"] = "".join(thinking)
                messages.append(chat)
        return messages, notes


def _check_block(block: Any, where: str, notes: list[str]) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind not in _BLOCK_KEYS:
        raise ParamError(f"{where} has type {kind!r}; supported blocks are "
                         f"{', '.join(_BLOCK_KEYS)} (this server reads text only)", f"{where}.type")
    unknown = sorted(set(block) - _BLOCK_KEYS[kind] - _IGNORED_BLOCK_KEYS)
    if unknown:
        raise ParamError(f"{where}.{unknown[0]} is not supported", f"{where}.{unknown[0]}")
    for key in sorted(_BLOCK_KEYS[kind] - {"is_error", "content", "signature"}):
        if key not in block:
            raise ParamError(f"{where}.{key} is required", f"{where}.{key}")
    if kind == "text" and not isinstance(block["text"], str):
        raise ParamError(f"{where}.text must be a string", f"{where}.text")
    if "cache_control" in block:
        notes.append(f"{where}.cache_control is not needed: the prefix cache works by itself")
    return kind


def _text_blocks(blocks: list[dict[str, Any]], where: str, notes: list[str]) -> str:
    texts = []
    for j, block in enumerate(blocks):
        if _check_block(block, f"{where}[{j}]", notes) != "text":
            raise ParamError(f"{where}[{j}] must be a text block", f"{where}[{j}].type")
        texts.append(block["text"])
    return "".join(texts)
