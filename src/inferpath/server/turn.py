"""One assistant turn on the chat path, for the APIs that translate onto it.

The Responses API (responses.py) and Anthropic's Messages API (messages.py) are
translations: each turns its request into chat messages, function tools and a
``tool_choice``, and its answer back out of the chat answer. This module is the part in
between, the same steps as ``/v1/chat/completions`` (chat.py): the prompt rendered by the
model's chat template with the tools, ``tool_choice`` required or a named function
enforced by the grammar of tools.py, one engine request submitted, and the text parsed
back into content and tool calls (streamed through tool_stream.py). There is no second
engine loop: a turn is one ``Submission``.

``Turn.deltas()`` yields chat-style deltas (``{"reasoning_content": ..., "reasoning": ...}``,
``{"content": ...}`` and ``{"tool_calls": [...]}``, answer.py); ``Turn.result()`` waits
for the whole answer, its reasoning apart.
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
from inferpath.server.answer import (
    AnswerFormat,
    AnswerStream,
    answer_format,
    format_params,
    read_answer,
)
from inferpath.server.tools import (
    FunctionDefinition,
    ToolCall,
    ToolDefinition,
    ToolFields,
    tool_call_grammar,
    tool_format,
)


@dataclass
class TurnResult:
    """A finished turn: its reasoning (None: none written), text (outside tool calls),
    calls, and why it stopped."""

    reasoning: str | None
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
    answer: AnswerFormat  # reasoning parser and tool-call syntax
    prompt_ids: list[int]
    final: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    has_calls: bool = False
    text: str = ""
    reasoning: str | None = None  # after deltas(): all the reasoning (even if not included)

    async def deltas(self) -> AsyncIterator[dict[str, Any]]:
        """Chat deltas as the engine writes the answer (answer.py: reasoning, content,
        tool calls); afterwards ``finish_reason``, ``final``, ``has_calls`` and
        ``reasoning`` are set. Unfinished engine requests are aborted if the consumer stops
        early (Submission.outputs)."""
        stream = AnswerStream(self.answer)
        async for _, output in self.submission.outputs():
            completion = output.outputs[0]
            delta_text = completion.delta_text or ""
            self.text += delta_text
            for delta in stream.add(delta_text):
                yield delta
            if completion.finish_reason is not None:
                self.final = output
                self.stop_reason = completion.stop_reason
                self.finish_reason = completion.finish_reason
                deltas, self.has_calls = stream.finish()
                self.reasoning = stream.reasoning_text
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
        read = read_answer(self.answer, completion.text)
        finish_reason = completion.finish_reason
        if read.calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        return TurnResult(read.reasoning, read.content, read.calls, finish_reason,
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
                     renames: dict[str, str] | None = None,
                     template_kwargs: dict[str, Any] | None = None,
                     include_reasoning: bool = True) -> Turn:
    """Render ``messages`` (and the tools, and ``template_kwargs``) with the chat
    template, enforce a forced ``tool_choice`` by grammar, and submit one engine request
    (``params.n`` must be 1). ParamErrors and template failures are 400s naming
    ``tool_param`` / ``prompt_param``."""
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
        prompt_ids = await encode_messages(context, messages, True, tools.tools_for_template(),
                                           template_kwargs)
    except APIError as exc:  # named after chat's field: rename to this API's
        if exc.param == "messages":
            exc.param = prompt_param
        raise
    answer = answer_format(context.tokenizer, context.reasoning_parser, fmt, prompt_ids,
                           parses_tool_calls=tools.parses_tool_calls,
                           live_calls=stream and forced is not None and fmt == "hermes",
                           include_reasoning=include_reasoning, tool_names=tools.tool_names())
    params = format_params(params, answer, context)
    submission = await submit(context, prefix, [prompt_ids], params, prompt_param=prompt_param,
                              renames=renames)
    return Turn(submission, answer, prompt_ids)
