"""One assistant turn on the chat path, for the APIs that translate onto it.

The Responses API (responses.py) and Anthropic's Messages API (messages.py) are
translations: each turns its request into chat messages, function tools and a
``tool_choice``, and its answer back out of the chat answer. This module is the part in
between, the same steps as ``/v1/chat/completions`` (chat.py): the prompt rendered by the
model's chat template with the tools, ``tool_choice`` required or a named function
enforced by the grammar of tools.py, one engine request submitted, and the text parsed
back into content and tool calls (streamed through tool_stream.py). There is no second
engine loop: a turn is one ``Submission``.

``Turn.deltas()`` yields chat-style deltas (``{"content": ...}`` and ``{"tool_calls":
[...]}`` as tool_stream.py makes them); ``Turn.result()`` waits for the whole answer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import Request

from inferpath.sampling.params import SamplingParams
from inferpath.server.chat import encode_messages
from inferpath.server.engine_client import ServingContext, Submission, submit, usage
from inferpath.server.errors import APIError
from inferpath.server.protocol_extras import ParamError
from inferpath.server.tool_stream import LiveHermesStream, ToolCallStream
from inferpath.server.tools import (
    FunctionDefinition,
    ToolCall,
    ToolDefinition,
    ToolFields,
    parse_tool_calls,
    tool_call_grammar,
    tool_format,
)


@dataclass
class TurnResult:
    """A finished turn: its text (outside tool calls), calls, and why it stopped."""

    content: str
    calls: list[ToolCall]
    finish_reason: str  # stop | length | tool_calls | abort | error
    stop_reason: int | str | None  # the stop string or token id that ended it (None: EOS)
    final: Any  # the engine's finished RequestOutput

    @property
    def usage(self) -> dict[str, Any]:
        return usage([self.final])


@dataclass
class Turn:
    """One submitted engine request and how to read its answer."""

    submission: Submission
    fmt: str  # the tool-call syntax (tools.tool_format)
    parses_tool_calls: bool
    live_calls: bool  # grammar-enforced hermes calls: streamed as they are written
    prompt_ids: list[int]
    final: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    has_calls: bool = False
    text: str = ""

    async def deltas(self) -> AsyncIterator[dict[str, Any]]:
        """Chat deltas as the engine writes the answer; afterwards ``finish_reason``,
        ``final`` and ``has_calls`` are set. Unfinished engine requests are aborted if the
        consumer stops early (Submission.outputs)."""
        stream: ToolCallStream | LiveHermesStream | None = None
        if self.parses_tool_calls:
            stream = LiveHermesStream() if self.live_calls else ToolCallStream(self.fmt)
        async for _, output in self.submission.outputs():
            completion = output.outputs[0]
            delta_text = completion.delta_text or ""
            self.text += delta_text
            if stream is None:
                if delta_text:
                    yield {"content": delta_text}
            else:
                for delta in stream.add(delta_text):
                    yield delta
            if completion.finish_reason is not None:
                self.final = output
                self.stop_reason = completion.stop_reason
                self.finish_reason = completion.finish_reason
                if stream is not None:
                    deltas, self.has_calls = stream.finish()
                    for delta in deltas:
                        yield delta
                if self.has_calls and self.finish_reason == "stop":
                    self.finish_reason = "tool_calls"
                return

    def final_usage(self) -> dict[str, Any]:
        """Chat's usage object of the finished answer (after ``deltas()`` ended)."""
        return usage([self.final])

    async def result(self, request: Request) -> TurnResult:
        """The whole answer (aborted with a 499 if the client goes away first)."""
        (final,) = await self.submission.final_outputs(request)
        completion = final.outputs[0]
        content, calls = completion.text, []
        if self.parses_tool_calls:
            content, calls = parse_tool_calls(completion.text, self.fmt)
        finish_reason = completion.finish_reason
        if calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        return TurnResult(content if calls else completion.text, calls, finish_reason,
                          completion.stop_reason, final)


def function_tools(functions: list[FunctionDefinition], tool_choice: Any,
                   parallel_tool_calls: bool | None) -> ToolFields:
    """The chat route's tool fields for ``functions``; ``tool_choice`` as chat spells it
    (``none``, ``auto``, ``required`` or ``{"type": "function", "function": {"name"}}``)."""
    tools = [ToolDefinition(type="function", function=f) for f in functions] or None
    return ToolFields.model_validate({"tools": tools, "tool_choice": tool_choice,
                                      "parallel_tool_calls": parallel_tool_calls})


async def start_turn(context: ServingContext, prefix: str, messages: list[dict[str, Any]],
                     tools: ToolFields, params: SamplingParams, *, stream: bool,
                     tool_param: str, prompt_param: str,
                     renames: dict[str, str] | None = None) -> Turn:
    """Render ``messages`` (and the tools) with the chat template, enforce a forced
    ``tool_choice`` by grammar, and submit one engine request (``params.n`` must be 1).
    ParamErrors and template failures are 400s naming ``tool_param`` / ``prompt_param``."""
    fmt = tool_format(context.tokenizer.chat_template)
    try:
        forced = tools.forced_tools()
        if forced is not None:
            if params.structured is not None:
                raise ParamError("a forced tool choice cannot be combined with "
                                 f"{params.structured.param}", tool_param)
            parallel = tools.parallel_tool_calls is not False and len(forced) > 1
            grammar = dataclasses.replace(tool_call_grammar(forced, fmt, parallel), param=tool_param)
            params = dataclasses.replace(params, structured=grammar)
    except ParamError as exc:
        raise APIError(400, str(exc), param=tool_param if exc.param == "tool_choice" else exc.param
                       ) from None
    try:
        prompt_ids = await encode_messages(context, messages, True, tools.tools_for_template())
    except APIError as exc:  # named after chat's field: rename to this API's
        if exc.param == "messages":
            exc.param = prompt_param
        raise
    submission = await submit(context, prefix, [prompt_ids], params, prompt_param=prompt_param,
                              renames=renames)
    live = stream and forced is not None and fmt == "hermes"
    return Turn(submission, fmt, tools.parses_tool_calls, live, prompt_ids)
