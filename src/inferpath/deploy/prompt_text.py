"""The text a request's prompt starts with, as the router hashes it (routing.py).

The router needs no tokenizer and no chat template: what matters is that two requests
whose prompts share a prefix give texts that share a prefix. So the text is the request's
fields in the order the chat template renders them (instructions or system first, then
each message's role and content), each part ended by a separator that cannot occur in
JSON-decoded text of another field boundary. A body that does not parse gives "" and the
router falls back to load; the replica's app then answers the error itself.
"""

from __future__ import annotations

import json
from typing import Any

_SEP = "\x1e"  # ASCII record separator between fields


def routing_text(path: str, body: bytes) -> str:
    """The prompt text of a POST to ``path`` with JSON ``body`` ("" if there is none)."""
    try:
        payload = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(payload, dict):
        return ""
    parts: list[str] = []
    if path.endswith("/completions") and not path.endswith("/chat/completions"):
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0]  # a batch: route on its first prompt
        parts.append(_content_text(prompt))
    else:
        # /v1/chat/completions, /v1/responses, /v1/messages
        for key in ("instructions", "system"):
            if key in payload:
                parts.append(_content_text(payload[key]))
        messages = payload.get("messages", payload.get("input"))
        if isinstance(messages, str):
            parts.append(messages)
        elif isinstance(messages, list):
            for message in messages:
                if isinstance(message, dict):
                    parts.append(f"{message.get('role', '')}:{_content_text(message.get('content'))}")
    return _SEP.join(parts)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: [{"type": "text", "text": ...}, ...] or token ids
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) + " "
                       for part in content)
    return str(content)
