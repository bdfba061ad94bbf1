"""POST /v1/chat/completions: messages rendered by the model's chat template.

The prompt is built by ``tokenizer.encode_chat``: the template's control tokens become
special ids, message content never does (a user who types ``<|im_end|>`` gets those
characters, not an end of turn). Streaming follows OpenAI: each choice opens with a
``{"role": "assistant", "content": ""}`` delta, then content deltas, then an empty delta
with the finish reason.

With ``tools`` the tools are rendered by the template, ``tool_choice`` ``required`` or a
named function is enforced by a grammar (server/tools.py), and the answer is parsed back
into ``message.tool_calls`` (finish_reason ``tool_calls``), streamed as in tool_stream.py.

A reasoning model's thinking (server/reasoning.py) comes back apart from the content, in
``message.reasoning_content`` and ``message.reasoning`` (null when it wrote none; both
fields present whenever the server has a reasoning parser), streamed as
``delta.reasoning_content`` / ``delta.reasoning``; ``include_reasoning: false`` drops it.
``reasoning_effort`` and ``chat_template_kwargs`` are variables for the chat template.
"""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from inferpath.server.engine_client import (
    ServingContext,
    Submission,
    check_text,
    submit,
    usage,
    with_usage_so_far,
)
from inferpath.server.errors import APIError
from inferpath.server.logprobs import chat_logprobs
from inferpath.server.protocol import ChatCompletionRequest, ParamError
from inferpath.server.sse import sse_response
from inferpath.server.answer import (
    AnswerFormat,
    AnswerStream,
    answer_format,
    format_params,
    read_answer,
)
from inferpath.server.reasoning import history_reasoning, template_variables
from inferpath.server.tools import tool_call_grammar, tool_format


async def encode_messages(context: ServingContext, messages: list[dict[str, Any]],
                          add_generation_prompt: bool, tools: list[dict] | None = None,
                          template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of the rendered chat (and ``tools``, the template's ``tools`` variable;
    ``template_kwargs``, more variables), rendered and tokenized off the event loop; 400
    naming ``messages`` if the template refuses or the text is not valid Unicode. Earlier
    reasoning goes under the key the template reads (reasoning.history_reasoning)."""
    template = context.tokenizer.chat_template
    if not template:
        raise APIError(400, f"model {context.model_name!r} has no chat template; "
                       "use /v1/completions", param="messages")
    for message in messages:
        check_text(message["content"], "messages")
    messages = history_reasoning(messages, template)
    try:
        return await context.run_off_loop(
            context.tokenizer.encode_chat, messages, add_generation_prompt=add_generation_prompt,
            tools=tools, template_kwargs=template_kwargs or None)
    except ValueError as exc:
        raise APIError(400, f"chat template failed: {exc}", param="messages") from None


async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 context: ServingContext) -> Response:
    context.check_model(body.model)
    fmt = tool_format(context.tokenizer.chat_template)
    try:
        params = context.sampling(body.to_sampling_params(), body)
        messages = body.chat_messages()
        variables = template_variables(context.tokenizer.chat_template, body.chat_template_kwargs,
                                       body.reasoning_effort)
        forced = body.forced_tools()
        if forced is not None:
            if params.structured is not None:
                raise ParamError("tool_choice 'required' or a named function cannot be combined "
                                 f"with {params.structured.param}", "tool_choice")
            parallel = body.parallel_tool_calls is not False and len(forced) > 1
            params = dataclasses.replace(params, structured=tool_call_grammar(forced, fmt, parallel))
    except ParamError as exc:
        raise APIError(400, str(exc), param=exc.param) from None
    prompt_ids = await encode_messages(context, messages, body.add_generation_prompt,
                                       body.tools_for_template(), variables)
    answer = answer_format(context.tokenizer, context.reasoning_parser, fmt, prompt_ids,
                           parses_tool_calls=body.parses_tool_calls,
                           live_calls=body.stream and forced is not None and fmt == "hermes",
                           include_reasoning=body.include_reasoning, tool_names=body.tool_names())
    params = format_params(params, answer, context)
    renames = {"max_tokens": "max_completion_tokens"} if body.max_completion_tokens is not None else {}
    submission = await submit(context, "chatcmpl", [prompt_ids], params, prompt_param="messages",
                              renames=renames)
    num_top = body.top_logprobs or 0
    if body.stream:
        chunks = _stream_chunks(body, context, submission, num_top, answer)
        if body.usage_in_every_chunk:
            chunks = with_usage_so_far(chunks, submission)
        return sse_response(chunks, submission.abort_unfinished)
    (final,) = await submission.final_outputs(request)
    choices = []
    for completion in final.outputs:
        logprobs = None
        if body.logprobs:
            logprobs = chat_logprobs(context.tokenizer, list(completion.logprobs or ()), num_top)
        read = read_answer(answer, completion.text)
        message: dict[str, Any] = {"role": "assistant", "content": read.content}
        if answer.reasoning_parser != "none":
            message["reasoning_content"] = message["reasoning"] = read.reasoning
        finish_reason = completion.finish_reason
        if read.calls:
            message["content"] = read.content or None
            message["tool_calls"] = [call.as_openai() for call in read.calls]
            finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
        choices.append({
            "index": completion.index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
            "stop_reason": completion.stop_reason,
        })
    return JSONResponse({
        "id": submission.id,
        "object": "chat.completion",
        "created": submission.created,
        "model": context.model_name,
        "choices": choices,
        "usage": usage([final]),
    })


async def _stream_chunks(body: ChatCompletionRequest, context: ServingContext,
                         submission: Submission, num_top: int,
                         answer: AnswerFormat) -> AsyncIterator[dict[str, Any]]:
    base = {"id": submission.id, "object": "chat.completion.chunk",
            "created": submission.created, "model": context.model_name}
    for index in range(body.n):
        opening = {"role": "assistant", "content": ""}
        yield {**base, "choices": [_choice(index, opening, None, None)]}
    streams = {i: AnswerStream(answer) for i in range(body.n)}
    num_tokens_sent: dict[int, int] = {}  # choice index -> tokens whose logprobs were sent
    done: set[int] = set()  # choice indices whose finish chunk was sent
    final = None
    async for _, output in submission.outputs():
        if output.finished:
            final = output
        for completion in output.outputs:
            index = completion.index
            delta_text = completion.delta_text or ""
            if index in done or (not delta_text and completion.finish_reason is None):
                continue
            logprobs = None
            if body.logprobs:
                start = num_tokens_sent.get(index, 0)
                entries = list(completion.logprobs or ())[start:len(completion.token_ids)]
                num_tokens_sent[index] = start + len(entries)
                logprobs = chat_logprobs(context.tokenizer, entries, num_top)
            finish_reason = completion.finish_reason
            deltas = streams[index].add(delta_text)
            if logprobs and logprobs["content"] and not deltas:
                deltas = [{"content": ""}]  # the tokens' logprobs go out even if their text waits
            for delta in deltas:
                yield {**base, "choices": [_choice(index, delta, logprobs, None)]}
                logprobs = None
            if finish_reason is not None:
                deltas, has_calls = streams[index].finish()
                for delta in deltas:
                    yield {**base, "choices": [_choice(index, delta, None, None)]}
                if has_calls and finish_reason == "stop":
                    finish_reason = "tool_calls"
                done.add(index)
                yield {**base, "choices": [_choice(index, {}, None, finish_reason)]}
    if body.include_usage_in_stream and final is not None:
        yield {**base, "choices": [], "usage": usage([final])}


def _choice(index: int, delta: dict[str, Any], logprobs: Any,
            finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
