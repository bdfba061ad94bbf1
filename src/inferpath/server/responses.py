"""POST /v1/responses (OpenAI's Responses API), and GET / DELETE of stored responses.

A translation onto the chat path (turn.py): ``instructions`` become the system message,
the conversation of ``previous_response_id`` (response_store.py) comes next, then the
input items (responses_items.py); the answer comes back as output items: a
``reasoning`` item when the model reasoned (server/reasoning.py; its text in one
``reasoning_text`` part), a ``message`` with one ``output_text`` part, and one
``function_call`` item per call (with its ``call_id``). A length stop is status ``incomplete`` (reason ``max_output_tokens``).
Streamed as the typed events of responses_stream.py.

Fields accepted without effect (hosted tools, Codex's extras) are listed in the
response's ``warnings`` and logged, never dropped in silence.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from inferpath.server.engine_client import ServingContext
from inferpath.server.errors import APIError
from inferpath.server.event_stream import named_event_response
from inferpath.server.protocol_extras import ParamError
from inferpath.server.reasoning import template_variables
from inferpath.server.response_store import ResponseNotFound, ResponseStore, StoredResponse
from inferpath.server.responses_items import input_items, items_as_messages
from inferpath.server.responses_protocol import ResponsesRequest, ResponseTools, response_tools
from inferpath.server.responses_stream import ResponseEvents
from inferpath.server.tools import ToolCall
from inferpath.server.turn import TurnResult, function_tools, start_turn

log = logging.getLogger("inferpath.server.responses")


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ResponseDraft:
    """What a response object is built from, before and after its answer."""

    body: ResponsesRequest
    context: ServingContext
    id: str
    created_at: int
    warnings: list[str]
    tools: ResponseTools
    effort: str | None = None  # reasoning.effort, echoed

    def response(self, status: str, output: list[dict[str, Any]],
                 usage: dict[str, Any] | None, finish_reason: str | None = None) -> dict[str, Any]:
        body = self.body
        text_format = body.text.format.model_dump(by_alias=True, exclude_none=True) \
            if body.text is not None and body.text.format is not None else {"type": "text"}
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if finish_reason == "length" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {}, "model": self.context.model_name,
            "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": self.effort, "summary": None}, "store": body.store,
            "temperature": body.temperature, "text": {"format": text_format},
            "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
            "top_p": body.top_p, "truncation": "disabled", "usage": usage,
            "user": body.user, "safety_identifier": body.safety_identifier,
            "warnings": self.warnings,
        }

    def function_call_item(self, call_id: str, flat_name: str, arguments: str,
                           status: str = "completed") -> dict[str, Any]:
        namespace, name = self.tools.split(flat_name)
        item = {"id": new_item_id("fc"), "type": "function_call", "status": status,
                "call_id": call_id, "name": name, "arguments": arguments}
        if namespace is not None:
            item["namespace"] = namespace
        return item


def response_usage(chat_usage: dict[str, Any], reasoning_tokens: int = 0) -> dict[str, Any]:
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": chat_usage["total_tokens"]}


def count_reasoning_tokens(context: ServingContext, reasoning: str | None) -> int:
    """Tokens of the reasoning text, re-encoded (the engine counts tokens, not channels;
    the tags around the reasoning are not counted)."""
    return len(context.tokenizer.encode(reasoning, add_bos=False)) if reasoning else 0


def reasoning_item(text: str, status: str = "completed") -> dict[str, Any]:
    """A ``reasoning`` output item holding the whole reasoning text (no summary)."""
    return {"id": new_item_id("rs"), "type": "reasoning", "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": new_item_id("msg"), "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def response_status(finish_reason: str | None) -> str:
    return {"stop": "completed", "tool_calls": "completed", "length": "incomplete",
            "abort": "cancelled"}.get(finish_reason or "", "failed")


async def create_response(body: ResponsesRequest, request: Request, context: ServingContext,
                          store: ResponseStore) -> Response:
    context.check_model(body.model)
    try:
        tools = response_tools(body.tools)
        history: list[dict[str, Any]] = []
        if body.previous_response_id is not None:
            history = _stored(store, body.previous_response_id).messages
        items = input_items(body.input)
        new_messages, item_warnings = items_as_messages(items, tools)
        params = context.sampling(body.to_sampling_params(), body)
        tool_choice = tools.chat_tool_choice(body.tool_choice)
        if not tools.functions and tool_choice == "auto":
            tool_choice = None  # every tool was a hosted one: nothing to choose from
        fields = function_tools(tools.functions, tool_choice, body.parallel_tool_calls)
        effort = body.reasoning_effort()
        effort_warnings = []
        if effort is not None and "reasoning_effort" not in (context.tokenizer.chat_template or ""):
            effort_warnings.append(f"reasoning.effort {effort!r} is not used: this model's chat "
                                   "template takes no reasoning effort")
            effort = None
        variables = template_variables(context.tokenizer.chat_template, None, effort,
                                       effort_param="reasoning.effort")
    except ParamError as exc:
        raise APIError(400, str(exc), param=exc.param) from None
    if not history and not new_messages:
        raise APIError(400, "input holds no message", param="input")
    warnings = body.warnings() + tools.warnings() + item_warnings + effort_warnings
    instructions = [{"role": "system", "content": body.instructions}] if body.instructions else []
    turn = await start_turn(context, "resp", instructions + history + new_messages, fields, params,
                            stream=body.stream, tool_param="tool_choice", prompt_param="input",
                            renames={"max_tokens": "max_output_tokens"},
                            template_kwargs=variables)
    draft = ResponseDraft(body, context, turn.submission.id.replace("resp-", "resp_", 1),
                          turn.submission.created, warnings, tools, effort)
    if warnings:
        log.warning("%s: accepted without effect: %s", draft.id, "; ".join(warnings))
    stored_items = [_stored_item(item) for item in items]

    def keep(response: dict[str, Any], content: str, calls: list[ToolCall],
             reasoning: str | None) -> None:
        if not body.store or response["status"] not in ("completed", "incomplete"):
            return
        answer: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            answer["reasoning_content"] = reasoning
        if calls:
            answer["tool_calls"] = [{"id": c.id, "type": "function",
                                     "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                    for c in calls]
        if not store.put(StoredResponse(response, stored_items, history + new_messages + [answer])):
            log.warning("%s: not stored: larger than the whole response store (%d MiB)",
                        draft.id, store.max_bytes // 2**20)

    if body.stream:
        events = ResponseEvents(draft, turn, keep)
        return named_event_response(events.events(), turn.submission.abort_unfinished,
                                    events.error_event)
    result: TurnResult = await turn.result(request)
    output = []
    status = response_status(result.finish_reason)
    item_status = "incomplete" if status == "incomplete" else "completed"
    if result.reasoning is not None:
        output.append(reasoning_item(result.reasoning, item_status))
    if result.content or not result.calls:
        output.append(message_item(result.content, item_status))
    output += [draft.function_call_item(c.id, c.name, c.arguments) for c in result.calls]
    usage = response_usage(result.usage, count_reasoning_tokens(context, result.reasoning))
    response = draft.response(status, output, usage, result.finish_reason)
    keep(response, result.content, result.calls, result.reasoning)
    return JSONResponse(response)


def _stored_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as ``input_items`` lists it: with its type and an id."""
    kind = item.get("type", "message")
    prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(kind, "item")
    return {"id": item.get("id") or new_item_id(prefix), "type": kind,
            **{k: v for k, v in item.items() if k not in ("id", "type")}}


def _stored(store: ResponseStore, response_id: str) -> StoredResponse:
    try:
        return store.get(response_id)
    except ResponseNotFound as exc:
        param = "previous_response_id"
        raise APIError(404, str(exc), param=param, code="response_not_found") from None


def get_response(store: ResponseStore, response_id: str) -> dict[str, Any]:
    try:
        return store.get(response_id).response
    except ResponseNotFound as exc:
        raise APIError(404, str(exc), code="response_not_found") from None


def delete_response(store: ResponseStore, response_id: str) -> dict[str, Any]:
    try:
        store.delete(response_id)
    except ResponseNotFound as exc:
        raise APIError(404, str(exc), code="response_not_found") from None
    return {"id": response_id, "object": "response.deleted", "deleted": True}


def list_input_items(store: ResponseStore, response_id: str, limit: int = 20,
                     order: str = "desc", after: str | None = None) -> dict[str, Any]:
    """OpenAI's cursor page of a stored response's input items (newest first by default)."""
    if not 1 <= limit <= 100:
        raise APIError(400, f"limit is {limit}; it must be between 1 and 100", param="limit")
    if order not in ("asc", "desc"):
        raise APIError(400, f"order must be 'asc' or 'desc', got {order!r}", param="order")
    try:
        items = list(store.get(response_id).input_items)
    except ResponseNotFound as exc:
        raise APIError(404, str(exc), code="response_not_found") from None
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise APIError(400, f"after names item {after!r}, which is not an input item of "
                           f"{response_id!r}", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
