"""POST /v1/completions: prompts in, text out, streamed as SSE or in one JSON body.

Choices are indexed prompt-major: prompt p's sample i is choice ``p * n + i``. With
``echo`` the prompt's text precedes each choice's text (and the first streamed chunk);
with ``echo`` and ``logprobs`` the logprobs cover the prompt's tokens too (the first one
None), as vLLM does; the streamed echo chunk then waits for the prompt to be computed.
Logprobs of each chunk are the entries of the tokens not reported before, so the
concatenation of every chunk's logprobs equals the non-streamed logprobs.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from inferpath.server.engine_client import (
    ServingContext,
    Submission,
    submit,
    usage,
    with_usage_so_far,
)
from inferpath.server.errors import APIError
from inferpath.server.logprobs import (
    completion_logprobs,
    merge_completion_logprobs,
    prompt_completion_logprobs,
)
from inferpath.server.protocol import CompletionRequest, ParamError
from inferpath.server.sse import sse_response


async def create_completion(body: CompletionRequest, request: Request,
                            context: ServingContext) -> Response:
    context.check_model(body.model)
    try:
        params = context.sampling(body.to_sampling_params(), body)
    except ParamError as exc:
        raise APIError(400, str(exc), param=exc.param) from None
    prompts = body.prompts()
    submission = await submit(context, "cmpl", prompts, params, prompt_param="prompt")
    echoes = [_prompt_text(context, p) if body.echo else "" for p in prompts]
    if body.stream:
        chunks = _stream_chunks(body, context, submission, echoes, params.n)
        if body.usage_in_every_chunk:
            chunks = with_usage_so_far(chunks, submission)
        return sse_response(chunks, submission.abort_unfinished)
    finals = await submission.final_outputs(request)
    choices = []
    for p, final in enumerate(finals):
        for completion in final.outputs:
            choice = {
                "index": p * params.n + completion.index,
                "text": echoes[p] + completion.text,
                "logprobs": None,
                "finish_reason": completion.finish_reason,
                "stop_reason": completion.stop_reason,
            }
            if body.logprobs is not None:
                choice["logprobs"] = completion_logprobs(
                    context.tokenizer, list(completion.logprobs or ()), len(echoes[p]))
                if body.echo:
                    choice["logprobs"] = merge_completion_logprobs(
                        _prompt_logprobs(context, final), choice["logprobs"])
            choices.append(choice)
    return JSONResponse({
        "id": submission.id,
        "object": "text_completion",
        "created": submission.created,
        "model": context.model_name,
        "choices": choices,
        "usage": usage(finals),
    })


def _prompt_logprobs(context: ServingContext, output: Any) -> dict[str, Any]:
    return prompt_completion_logprobs(context.tokenizer, list(output.prompt_token_ids),
                                      list(output.prompt_logprobs or [None]))


def _prompt_text(context: ServingContext, prompt: str | list[int]) -> str:
    if isinstance(prompt, str):
        return prompt
    return context.tokenizer.decode(prompt, skip_special_tokens=False)


async def _stream_chunks(body: CompletionRequest, context: ServingContext,
                         submission: Submission, echoes: list[str],
                         n: int) -> AsyncIterator[dict[str, Any]]:
    base = {"id": submission.id, "object": "text_completion",
            "created": submission.created, "model": context.model_name}
    num_tokens_sent: dict[int, int] = {}  # choice index -> tokens whose logprobs were sent
    num_chars_sent: dict[int, int] = {}  # choice index -> characters of text sent
    finals: list[Any] = [None] * len(echoes)
    done: set[int] = set()  # choice indices whose finish chunk was sent
    with_prompt_logprobs = body.logprobs is not None  # the echo waits for them
    echoed: set[int] = set()
    for p, echo in enumerate(echoes):
        if echo and not with_prompt_logprobs:
            for i in range(n):
                num_chars_sent[p * n + i] = len(echo)
                yield {**base, "choices": [_choice(p * n + i, echo, None, None)]}
    async for p, output in submission.outputs():
        if echoes[p] and with_prompt_logprobs and p not in echoed:
            echoed.add(p)
            for i in range(n):
                num_chars_sent[p * n + i] = len(echoes[p])
                yield {**base, "choices": [_choice(p * n + i, echoes[p],
                                                  _prompt_logprobs(context, output), None)]}
        if output.finished:
            finals[p] = output
        for completion in output.outputs:
            index = p * n + completion.index
            delta_text = completion.delta_text or ""
            if index in done or (not delta_text and completion.finish_reason is None):
                continue
            if completion.finish_reason is not None:
                done.add(index)
            logprobs = None
            if body.logprobs is not None:
                start = num_tokens_sent.get(index, 0)
                entries = list(completion.logprobs or ())[start:len(completion.token_ids)]
                num_tokens_sent[index] = start + len(entries)
                logprobs = completion_logprobs(context.tokenizer, entries,
                                               num_chars_sent.get(index, 0))
            num_chars_sent[index] = num_chars_sent.get(index, 0) + len(delta_text)
            yield {**base, "choices": [
                _choice(index, delta_text, logprobs, completion.finish_reason)]}
    if body.include_usage_in_stream:
        yield {**base, "choices": [], "usage": usage([f for f in finals if f is not None])}


def _choice(index: int, text: str, logprobs: Any, finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
