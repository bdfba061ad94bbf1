"""Reading one answer: its text split into reasoning, content and tool calls.

The answer's text goes first through the model's reasoning parser (reasoning.py), then
its content through the tool-call parser of the model's syntax (tools.py, tool_stream.py);
gpt-oss's harmony parser yields its calls itself. ``AnswerStream`` does it incrementally
and returns chat deltas; ``read_answer`` does it for a finished text. Both paths run the
same parsers, so a streamed answer and a whole one agree.

Chat deltas: ``{"reasoning_content": t, "reasoning": t}`` (llama.cpp's name and vLLM's,
always both), ``{"content": t}``, ``{"tool_calls": [...]}`` as tool_stream.py makes them.
With ``include_reasoning`` false the reasoning is parsed out and dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from inferpath.server.reasoning import (
    ReasoningParser,
    new_reasoning_parser,
    prompt_opens_think,
    split_reasoning,
)
from inferpath.server.tool_stream import ARGUMENT_FRAGMENT_CHARS, LiveHermesStream, ToolCallStream
from inferpath.server.tools import ToolCall, parse_tool_calls

#: Prompt tokens decoded to see whether the prompt ends inside a think block.
PROMPT_TAIL_TOKENS = 8


@dataclass(frozen=True)
class AnswerFormat:
    """How one request's answer is read."""

    reasoning_parser: str = "none"  # one of reasoning.REASONING_PARSERS
    starts_inside: bool = False  # the prompt opened a think block
    tool_format: str = "hermes"  # tools.tool_format
    parses_tool_calls: bool = False
    live_calls: bool = False  # grammar-enforced hermes calls, streamed as written
    include_reasoning: bool = True
    tool_names: tuple[str, ...] = ()  # the offered tools (bare-JSON hermes calls name one)

    def new_parser(self) -> ReasoningParser | None:
        return new_reasoning_parser(self.reasoning_parser, self.starts_inside)

    @property
    def needs_special_tokens(self) -> bool:
        """Harmony's channels are special tokens: decode with skip_special_tokens=False."""
        return self.reasoning_parser == "gpt_oss"


def format_params(params: Any, fmt: "AnswerFormat", context: Any) -> Any:
    """``params`` as the answer format needs them: harmony decoded with its control
    tokens, and the format's stop tokens (reasoning.FORMAT_STOP_TOKENS) added."""
    changes: dict[str, Any] = {}
    if fmt.needs_special_tokens:
        changes["skip_special_tokens"] = False
    extra = [i for i in context.format_stop_token_ids if i not in params.stop_token_ids]
    if extra:
        changes["stop_token_ids"] = tuple(params.stop_token_ids) + tuple(extra)
    return dataclasses.replace(params, **changes) if changes else params


def answer_format(tokenizer: Any, reasoning_parser: str, tool_format: str, prompt_ids: list[int],
                  **fields: Any) -> AnswerFormat:
    """The AnswerFormat of a request whose rendered prompt is ``prompt_ids``."""
    starts_inside = False
    if reasoning_parser in ("qwen3", "deepseek_r1"):
        tail = tokenizer.decode(prompt_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
        starts_inside = prompt_opens_think(tail)
    return AnswerFormat(reasoning_parser, starts_inside, tool_format, **fields)


@dataclass
class Answer:
    """A finished answer: reasoning (None: the model wrote none), content, calls."""

    reasoning: str | None
    content: str
    calls: list[ToolCall] = field(default_factory=list)


def read_answer(fmt: AnswerFormat, text: str) -> Answer:
    reasoning, content, harmony_calls = split_reasoning(fmt.new_parser(), text)
    calls: list[ToolCall] = []
    if fmt.reasoning_parser == "gpt_oss":
        if fmt.parses_tool_calls:
            calls = harmony_calls
        else:  # a call of a tool nobody offered: its text is the answer
            content += "".join(call.arguments for call in harmony_calls)
    elif fmt.parses_tool_calls:
        parsed, calls = parse_tool_calls(content, fmt.tool_format, fmt.tool_names)
        content = parsed if calls else content
    return Answer(reasoning if fmt.include_reasoning else None, content, calls)


class AnswerStream:
    """One answer's text deltas in, chat deltas out (see the module docstring)."""

    def __init__(self, fmt: AnswerFormat) -> None:
        self.fmt = fmt
        self.parser = fmt.new_parser()
        self.tools: ToolCallStream | LiveHermesStream | None = None
        if fmt.parses_tool_calls and fmt.reasoning_parser != "gpt_oss":
            self.tools = LiveHermesStream() if fmt.live_calls else ToolCallStream(fmt.tool_format, fmt.tool_names)
        self.num_calls = 0  # harmony calls sent
        self.reasoning_text: str | None = None  # all reasoning so far (None: none yet)

    def add(self, text: str) -> list[dict[str, Any]]:
        if self.parser is None:
            return self._content(text)
        return self._deltas(self.parser.add(text))

    def finish(self) -> tuple[list[dict[str, Any]], bool]:
        """(the remaining deltas, whether the answer held tool calls)."""
        deltas = self._deltas(self.parser.finish()) if self.parser is not None else []
        if self.tools is None:
            return deltas, self.num_calls > 0
        tail, has_calls = self.tools.finish()
        return deltas + tail, has_calls

    def _deltas(self, pieces: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        for kind, value in pieces:
            if kind == "reasoning":
                self.reasoning_text = (self.reasoning_text or "") + value
                if value and self.fmt.include_reasoning:
                    deltas.append({"reasoning_content": value, "reasoning": value})
            elif kind == "content":
                deltas += self._content(value)
            elif self.fmt.parses_tool_calls:  # a harmony call
                deltas += self._call(value)
            else:
                deltas += self._content(value.arguments)
        return deltas

    def _content(self, text: str) -> list[dict[str, Any]]:
        if self.tools is not None:
            return self.tools.add(text)
        return [{"content": text}] if text else []

    def _call(self, call: ToolCall) -> list[dict[str, Any]]:
        index = self.num_calls
        self.num_calls += 1
        opening = call.as_openai(index)
        opening["function"] = {"name": call.name, "arguments": ""}
        deltas = [{"tool_calls": [opening]}]
        for i in range(0, len(call.arguments), ARGUMENT_FRAGMENT_CHARS):
            fragment = call.arguments[i:i + ARGUMENT_FRAGMENT_CHARS]
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
        return deltas
