"""POST /v1/chat/completions: messages rendered by the model's chat template.

The prompt is built by ``tokenizer.encode_chat``: the template's control tokens become
special ids, message content never does (a user who types ``<|im_end|>`` gets those
characters, not an end of turn). Streaming follows OpenAI: each choice opens with a
``{"role": "assistant", "content": ""}`` delta, then content deltas, then an empty delta
with the finish reason.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from inferpath.server.engine_client import ServingContext, Submission, check_text, submit, usage
from inferpath.server.errors import APIError
from inferpath.server.logprobs import chat_logprobs
from inferpath.server.protocol import ChatCompletionRequest, ParamError
from inferpath.server.sse import sse_response


async def encode_messages(context: ServingContext, messages: list[dict[str, str]],
                          add_generation_prompt: bool) -> list[int]:
    """Token ids of the rendered chat, rendered and tokenized off the event loop; 400
    naming ``messages`` if the template refuses or the text is not valid Unicode."""
    if not context.tokenizer.chat_template:
        raise APIError(400, f"model {context.model_name!r} has no chat template; "
                       "use /v1/completions", param="messages")
    for message in messages:
        check_text(message["content"], "messages")
    try:
        return await context.run_off_loop(
            context.tokenizer.encode_chat, messages, add_generation_prompt=add_generation_prompt)
    except ValueError as exc:
        raise APIError(400, f"chat template failed: {exc}", param="messages") from None


async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 context: ServingContext) -> Response:
    context.check_model(body.model)
    try:
        params = body.to_sampling_params()
        messages = body.chat_messages()
    except ParamError as exc:
        raise APIError(400, str(exc), param=exc.param) from None
    prompt_ids = await encode_messages(context, messages, body.add_generation_prompt)
    renames = {"max_tokens": "max_completion_tokens"} if body.max_completion_tokens is not None else {}
    submission = await submit(context, "chatcmpl", [prompt_ids], params, prompt_param="messages",
                              renames=renames)
    num_top = body.top_logprobs or 0
    if body.stream:
        return sse_response(_stream_chunks(body, context, submission, num_top),
                            submission.abort_unfinished)
    (final,) = await submission.final_outputs(request)
    choices = []
    for completion in final.outputs:
        logprobs = None
        if body.logprobs:
            logprobs = chat_logprobs(context.tokenizer, list(completion.logprobs or ()), num_top)
        choices.append({
            "index": completion.index,
            "message": {"role": "assistant", "content": completion.text},
            "logprobs": logprobs,
            "finish_reason": completion.finish_reason,
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
                         submission: Submission, num_top: int) -> AsyncIterator[dict[str, Any]]:
    base = {"id": submission.id, "object": "chat.completion.chunk",
            "created": submission.created, "model": context.model_name}
    for index in range(body.n):
        opening = {"role": "assistant", "content": ""}
        yield {**base, "choices": [_choice(index, opening, None, None)]}
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
            if delta_text or logprobs and logprobs["content"]:
                yield {**base, "choices": [_choice(index, {"content": delta_text}, logprobs, None)]}
            if completion.finish_reason is not None:
                done.add(index)
                yield {**base, "choices": [_choice(index, {}, None, completion.finish_reason)]}
    if body.include_usage_in_stream and final is not None:
        yield {**base, "choices": [], "usage": usage([final])}


def _choice(index: int, delta: dict[str, Any], logprobs: Any,
            finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
