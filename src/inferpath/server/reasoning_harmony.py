"""gpt-oss's harmony format: channels of reasoning, answer and tool calls.

gpt-oss answers as a sequence of messages (the prompt ends with ``<|start|>assistant``)::

    <|channel|>analysis<|message|>THINKING<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

A message's header is the text before ``<|message|>``: its channel follows
``<|channel|>``, a recipient ``to=...`` may stand before or after it. The body ends at
``<|end|>``, ``<|call|>``, ``<|return|>`` (the last two are gpt-oss's stop tokens, so they
rarely reach the text), a new ``<|start|>`` or ``<|channel|>``, or the end of the answer.

Pieces: ``analysis`` bodies are reasoning; ``final`` bodies and ``commentary`` without a
recipient (the preambles gpt-oss writes before calling tools) are content; a body sent
``to=functions.NAME`` is a call of NAME whose arguments are the body, once closed. A call
whose arguments are not a JSON object is not a call: its body stays content, as the other
tool-call parsers leave a malformed call as text. An answer that does not start with a
header is plain content. The control tokens are special tokens, so the server decodes
this format with ``skip_special_tokens=False``.
"""

from __future__ import annotations

import json
import re

from inferpath.server.reasoning import Piece, possible_prefix_len
from inferpath.server.tools import ToolCall

_MESSAGE = "<|message|>"
_BODY_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>", "<|channel|>")
_HEADER_STARTS = ("<|start|>", "<|channel|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CONSUMED_ENDS = ("<|end|>", "<|call|>", "<|return|>")  # ends that belong to the body


class HarmonyParser:
    """Incremental harmony parsing (see the module docstring)."""

    def __init__(self) -> None:
        self.state = "header"  # header -> body -> header ...; or plain
        self.held = ""
        self.channel = ""
        self.recipient: str | None = None
        self.body = ""  # a call's arguments, held until it closes

    def add(self, text: str) -> list[Piece]:
        self.held += text
        return self._advance(final=False)

    def finish(self) -> list[Piece]:
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[Piece]:
        pieces: list[Piece] = []
        while True:
            if self.state == "plain":
                if self.held:
                    pieces.append(("content", self.held))
                    self.held = ""
                return pieces
            if self.state == "header":
                stripped = self.held.lstrip()
                if not stripped:
                    self.held = "" if final else self.held
                    return pieces
                if not stripped.startswith(_HEADER_STARTS):
                    if not final and any(tag.startswith(stripped) for tag in _HEADER_STARTS):
                        return pieces
                    self.state = "plain"
                    continue
                end = stripped.find(_MESSAGE)
                if end < 0:
                    if final:  # a header never finished: nothing to show
                        self.held = ""
                    return pieces
                self._read_header(stripped[:end])
                self.held, self.state, self.body = stripped[end + len(_MESSAGE):], "body", ""
            end, tag = _first_end(self.held)
            if end < 0 and not final:
                keep = possible_prefix_len(self.held, _BODY_ENDS)
                pieces += self._body(self.held[:len(self.held) - keep])
                self.held = self.held[len(self.held) - keep:]
                return pieces
            body_end = end if end >= 0 else len(self.held)
            pieces += self._body(self.held[:body_end])
            pieces += self._close()
            consumed = len(tag) if tag in _CONSUMED_ENDS else 0
            self.held = self.held[body_end + consumed:] if end >= 0 else ""
            self.state = "header"
            if end < 0:
                return pieces

    def _read_header(self, header: str) -> None:
        channel = _CHANNEL.search(header)
        self.channel = channel.group(1) if channel else ""
        recipient = _RECIPIENT.search(header)
        self.recipient = recipient.group(1) if recipient else None

    def _is_call(self) -> bool:
        return self.recipient is not None and self.recipient.startswith("functions.")

    def _body(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self._is_call():
            self.body += text
            return []
        kind = "reasoning" if self.channel == "analysis" else "content"
        return [(kind, text)]

    def _close(self) -> list[Piece]:
        if not self._is_call():
            return []
        arguments = self.body.strip()
        try:
            valid = isinstance(json.loads(arguments), dict)
        except json.JSONDecodeError:
            valid = False
        if not valid:
            return [("content", self.body)] if self.body else []
        name = self.recipient.removeprefix("functions.")  # type: ignore[union-attr]
        return [("call", ToolCall(name, json.dumps(json.loads(arguments), ensure_ascii=False)))]


def _first_end(text: str) -> tuple[int, str]:
    """(position, tag) of the first body end in ``text``, or (-1, "")."""
    found = [(text.find(tag), tag) for tag in _BODY_ENDS if tag in text]
    return min(found) if found else (-1, "")
