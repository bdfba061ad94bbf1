"""The input items of ``POST /v1/responses`` as chat messages for the template.

Items (responses_protocol.py lists the fields): ``message`` with ``input_text`` /
``output_text`` / ``text`` / ``refusal`` parts, ``function_call`` and
``function_call_output`` (consecutive calls become one assistant message's
``tool_calls``; namespace functions as ``namespace.name``), ``reasoning`` (its text given
to the next assistant turn). An unknown item type, key or content part is a 400 naming it.
"""

from __future__ import annotations

import json
from typing import Any

from inferpath.server.protocol_extras import ParamError
from inferpath.server.responses_protocol import ResponseTools

_ITEM_KEYS = {
    "message": {"type", "role", "content", "id", "status", "phase"},
    "function_call": {"type", "call_id", "name", "arguments", "id", "status", "namespace"},
    "function_call_output": {"type", "call_id", "output", "id", "status", "name", "namespace"},
    "reasoning": {"type", "id", "summary", "content", "encrypted_content", "status"},
}
_TEXT_PARTS = {"input_text", "output_text", "text", "refusal"}


def input_items(request_input: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input as items (a string is one user message)."""
    if isinstance(request_input, str):
        return [{"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": request_input}]}]
    return request_input


def items_as_messages(items: list[dict[str, Any]], tools: ResponseTools,
                      param: str = "input") -> tuple[list[dict[str, Any]], list[str]]:
    """(chat messages for the template, warnings) of Responses items; consecutive
    function calls become one assistant message's ``tool_calls``."""
    messages: list[dict[str, Any]] = []
    warnings: list[str] = []
    pending_reasoning: list[str] = []  # reasoning items' text, for the next assistant turn

    def assistant_turn(message: dict[str, Any]) -> dict[str, Any]:
        if pending_reasoning:
            message["reasoning_content"] = "".join(pending_reasoning)
            pending_reasoning.clear()
        return message

    for i, item in enumerate(items):
        where = f"{param}[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind not in _ITEM_KEYS:
            raise ParamError(f"{where} has type {kind!r}; supported item types are "
                             f"{', '.join(_ITEM_KEYS)}", f"{where}.type")
        unknown = sorted(set(item) - _ITEM_KEYS[kind])
        if unknown:
            raise ParamError(f"{where}.{unknown[0]} is not supported", f"{where}.{unknown[0]}")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ParamError(f"{where}.role must be user, system, developer or assistant, "
                                 f"got {role!r}", f"{where}.role")
            message = {"role": "system" if role == "developer" else role,
                       "content": _text(item.get("content"), f"{where}.content")}
            messages.append(assistant_turn(message) if role == "assistant" else message)
        elif kind == "function_call":
            call = _history_call(item, where, tools)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and not pending_reasoning:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append(assistant_turn({"role": "assistant", "content": "",
                                                "tool_calls": [call]}))
        elif kind == "function_call_output":
            messages.append(_tool_output(item, where))
        else:  # reasoning: its text goes with the next assistant turn (reasoning_content)
            text = _reasoning_text(item, where)
            if text is None:
                warnings.append(f"{where} is a reasoning item with no readable text "
                                "(encrypted_content only); it is not shown to the model")
            else:
                pending_reasoning.append(text)
    return messages, warnings


def _reasoning_text(item: dict[str, Any], where: str) -> str | None:
    """The text of a reasoning item: its ``reasoning_text`` parts, else its summary."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise ParamError(f"{where}.{key} must be a list of parts", f"{where}.{key}")
        texts = []
        for j, part in enumerate(parts):
            if not isinstance(part, dict) or part.get("type") != kind or not isinstance(part.get("text"), str):
                raise ParamError(f"{where}.{key}[{j}] must be a {kind} part with text",
                                 f"{where}.{key}[{j}]")
            texts.append(part["text"])
        if texts:
            return "".join(texts)
    return None


def _tool_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``function_call_output`` item as a chat ``tool`` message: the output of the call
    ``call_id``, or, without one, of the function ``name`` (in ``namespace``): Codex 0.169
    sends such an output that answers no call of the conversation (after ``create_goal``:
    ``{"name": "goal_objective", "namespace": "agent", "output": ...}``)."""
    call_id, name, namespace = item.get("call_id"), item.get("name"), item.get("namespace")
    for key, value in (("call_id", call_id), ("name", name), ("namespace", namespace)):
        if value is not None and not isinstance(value, str):
            raise ParamError(f"{where}.{key} must be a string", f"{where}.{key}")
    if call_id is None and name is None:
        raise ParamError(f"{where}.call_id is required (or the name of the function whose "
                         "output this is)", f"{where}.call_id")
    if namespace is not None and name is None:
        raise ParamError(f"{where}.namespace needs a name", f"{where}.name")
    message: dict[str, Any] = {"role": "tool", "content": _text(item.get("output"), f"{where}.output")}
    if call_id is not None:
        message["tool_call_id"] = call_id
    if name is not None:
        message["name"] = f"{namespace}.{name}" if namespace else name
    return message


def _history_call(item: dict[str, Any], where: str, tools: ResponseTools) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise ParamError(f"{where}.{key} is required (a string)", f"{where}.{key}")
    try:
        arguments = json.loads(item["arguments"]) if item["arguments"].strip() else {}
    except json.JSONDecodeError:
        raise ParamError(f"{where}.arguments is not JSON", f"{where}.arguments") from None
    name = f"{item['namespace']}.{item['name']}" if item.get("namespace") else item["name"]
    return {"id": item["call_id"], "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _text(content: Any, where: str) -> str:
    """Text of a message's content or a tool's output: a string, or text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(f"{where} must be a string or a list of parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise ParamError(f"{where}[{j}] has type {kind!r}; this server reads text parts only "
                             f"({', '.join(sorted(_TEXT_PARTS))})", f"{where}[{j}].type")
        text = part.get("refusal") if kind == "refusal" else part.get("text")
        if not isinstance(text, str):
            raise ParamError(f"{where}[{j}] has no text", f"{where}[{j}].text")
        texts.append(text)
    return "".join(texts)
