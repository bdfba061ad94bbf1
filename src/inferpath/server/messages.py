"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API.

A translation onto the chat path (turn.py), like the Responses API: the request's
``system``, ``messages`` and ``tools`` become chat messages and function tools
(messages_protocol.py); the answer comes back as ``thinking`` (a reasoning model's
reasoning, server/reasoning.py), ``text`` and ``tool_use`` blocks, with
``stop_reason`` ``end_turn``, ``max_tokens``, ``stop_sequence`` (and which one) or
``tool_use``. Streamed as Anthropic's events (messages_stream.py).

Usage follows Anthropic's split: ``input_tokens`` are the prompt tokens computed for this
request, ``cache_read_input_tokens`` those read from the prefix cache (their sum is the
prompt's length, which ``count_tokens`` returns); ``cache_creation_input_tokens`` is 0.

These routes answer in Anthropic's error shape (``{"type": "error", "error": {"type",
"message"}}``), so they parse and authenticate inside the handler rather than through the
app's OpenAI-shaped error handlers. The API key may come as ``x-api-key`` (Anthropic's
clients) or ``Authorization: Bearer``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from inferpath.server.chat import encode_messages
from inferpath.server.engine_client import ServingContext
from inferpath.server.errors import APIError, _validation_error_response, describe_unparseable_body
from inferpath.server.event_stream import named_event_response
from inferpath.server.messages_protocol import MessagesRequest
from inferpath.server.messages_stream import MessageEvents
from inferpath.server.protocol_extras import ParamError
from inferpath.server.turn import function_tools, start_turn

log = logging.getLogger("inferpath.server.messages")

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def install_messages_routes(app: FastAPI, context: ServingContext,
                            check_api_key: Callable[[Request], None]) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await _answer(request, context, check_api_key, create_message)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        return await _answer(request, context, check_api_key, count_message_tokens)


async def _answer(request: Request, context: ServingContext, check_api_key: Callable[[Request], None],
                  handler: Callable[..., Awaitable[Response]]) -> Response:
    try:
        check_api_key(request)
        raw = await request.body()
        try:
            body = MessagesRequest.model_validate_json(raw)
        except ValidationError as exc:  # the chat route's 400 message, in Anthropic's shape
            if any(error.get("type") == "json_invalid" for error in exc.errors()):
                # why, and the field: a huge integer, bytes not UTF-8, nesting too deep
                message, param = describe_unparseable_body(raw)
                raise APIError(400, message, param=param) from None
            reply = _validation_error_response(RequestValidationError(exc.errors()))
            raise APIError(400, json.loads(reply.body)["error"]["message"]) from None
        return await handler(body, request, context)
    except APIError as exc:
        context.metrics.record_error(exc.status)
        message = exc.message  # Anthropic's shape has no param field: the message names it
        if exc.param and exc.param not in message:
            message = f"{exc.param}: {message}"
        return JSONResponse(anthropic_error_body(exc.status, message), status_code=exc.status)


@dataclass
class Translation:
    """A Messages request as the chat path takes it."""

    messages: list[dict[str, Any]]
    fields: Any  # ToolFields
    notes: list[str]
    template_kwargs: dict[str, Any]  # enable_thinking, where the template reads it
    include_reasoning: bool  # false with thinking disabled


def _translate(body: MessagesRequest, context: ServingContext) -> Translation:
    context.check_model(body.model)
    try:
        messages, block_notes = body.chat_messages()
        notes = body.notes() + block_notes
        tool_choice, parallel = body.chat_tool_choice()
        fields = function_tools(body.functions(), tool_choice, parallel)
        fields.forced_tools()  # an unknown tool name is refused here too
        mode = body.thinking_mode()
    except ParamError as exc:
        raise APIError(400, str(exc), param=exc.param) from None
    notes += [f"tools[{i}].cache_control is not needed: the prefix cache works by "
                            "itself" for i, t in enumerate(body.tools or ()) if t.cache_control]
    template_kwargs = {}
    if mode is not None and "enable_thinking" in (context.tokenizer.chat_template or ""):
        template_kwargs["enable_thinking"] = mode == "enabled"
    elif mode == "enabled" and context.reasoning_parser == "none":
        notes.append("thinking is enabled, but this model writes no separable reasoning")
    return Translation(messages, fields, notes, template_kwargs, mode != "disabled")


async def count_message_tokens(body: MessagesRequest, request: Request,
                               context: ServingContext) -> Response:
    t = _translate(body, context)
    prompt_ids = await encode_messages(context, t.messages, True, t.fields.tools_for_template(),
                                       t.template_kwargs)
    return JSONResponse({"input_tokens": len(prompt_ids)})


async def create_message(body: MessagesRequest, request: Request, context: ServingContext) -> Response:
    t = _translate(body, context)
    messages, fields, notes = t.messages, t.fields, t.notes
    try:
        params = context.sampling(body.to_sampling_params(), body)
    except ParamError as exc:
        raise APIError(400, str(exc), param=exc.param) from None
    turn = await start_turn(context, "msg", messages, fields, params, stream=body.stream,
                            tool_param="tool_choice", prompt_param="messages",
                            renames={"stop": "stop_sequences"},
                            template_kwargs=t.template_kwargs,
                            include_reasoning=t.include_reasoning)
    message_id = turn.submission.id.replace("msg-", "msg_", 1)
    if notes:
        log.warning("%s: accepted without effect: %s", message_id, "; ".join(dict.fromkeys(notes)))
    if body.stream:
        events = MessageEvents(message_id, context.model_name, turn, body.stop_sequences or [])
        return named_event_response(events.events(), turn.submission.abort_unfinished,
                                    lambda exc: anthropic_error_body(getattr(exc, "status", 500), str(exc)))
    result = await turn.result(request)
    content: list[dict[str, Any]] = []
    if result.reasoning:
        content.append(thinking_block(result.reasoning))
    if result.content:
        content.append({"type": "text", "text": result.content})
    content += [{"type": "tool_use", "id": tool_use_id(call.id), "name": call.name,
                 "input": json.loads(call.arguments)} for call in result.calls]
    stop_reason, stop_sequence = stop_details(result.finish_reason, result.stop_reason,
                                              body.stop_sequences or [])
    return JSONResponse({
        "id": message_id, "type": "message", "role": "assistant", "model": context.model_name,
        "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
        "usage": message_usage(result.final),
    })


def thinking_block(text: str) -> dict[str, Any]:
    """A ``thinking`` block; its signature is empty (this server signs nothing)."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def tool_use_id(call_id: str) -> str:
    """Anthropic's ``toolu_`` id for a chat call id (``call_...``)."""
    return "toolu_" + call_id.removeprefix("call_") if call_id.startswith("call_") else call_id


def stop_details(finish_reason: str | None, stop_reason: int | str | None,
                 stop_sequences: list[str]) -> tuple[str, str | None]:
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(stop_reason, str) and stop_reason in stop_sequences:
        return "stop_sequence", stop_reason
    return "end_turn", None


def message_usage(final: Any) -> dict[str, Any]:
    cached = final.num_cached_tokens or 0
    return {"input_tokens": len(final.prompt_token_ids) - cached,
            "output_tokens": len(final.outputs[0].token_ids),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}
