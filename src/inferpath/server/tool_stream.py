"""Streaming a chat answer that may hold tool calls, as OpenAI streams it.

Content is streamed as it comes until the model starts a call (``<tool_call>`` for the
hermes syntax; for llama3_json an answer that opens with ``{`` or ``<|python_tag|>``, for
llama4 also ``[`` or ``<|python_start|>``);
from there the text is held until the choice finishes, then parsed, and each call goes out
as OpenAI sends it: one delta with the call's index, id, type, name and empty arguments,
then the arguments in fragments (``delta.tool_calls[].function.arguments``), which
concatenate to the full JSON.

When the calls are enforced by a grammar (``tool_choice`` required or named, hermes
syntax), each call is well-formed by construction, so it is streamed live
(``LiveHermesStream``): its opening delta as soon as ``"arguments":`` is written, then the
arguments as the model writes them (all but the last few characters, which may be the
call's closing ``}`` and ``</tool_call>``). Otherwise a call is parsed, and sent, once it
is closed: an unconstrained model may write a malformed one, which then stays text.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from inferpath.server.tool_pythonic import starts_pythonic
from inferpath.server.tools import parse_tool_calls

#: Characters of arguments JSON per streamed fragment.
ARGUMENT_FRAGMENT_CHARS = 16
_HERMES_OPEN = "<tool_call>"
_HERMES_CLOSE = "</tool_call>"
#: The start of a hermes call's JSON up to its arguments' value (name first: the grammar
#: writes the properties in that order).
_HERMES_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
#: Characters of streamed arguments held back: the call's own closing "}", whitespace and
#: "</tool_call>" may follow the arguments and must not be sent as part of them.
_LIVE_HOLD_BACK = len("}\n" + _HERMES_CLOSE) + 4


class ToolCallStream:
    """One choice's text deltas in, OpenAI deltas out (see the module docstring).
    ``tool_names`` (hermes): the offered tools; an answer that opens as a bare or fenced
    JSON object (tools.py's bare calls) is held until finish, since it may be one."""

    def __init__(self, fmt: str, tool_names: tuple[str, ...] = ()) -> None:
        self.fmt = fmt
        self.tool_names = tool_names
        self.text = ""
        self.num_content_sent = 0
        self.holding = False  # a call has started: nothing more goes out until finish
        self.num_calls = 0

    def add(self, delta_text: str) -> list[dict[str, Any]]:
        """Deltas to send now for ``delta_text`` (content only; calls come at finish)."""
        self.text += delta_text
        if self.holding:
            return []
        start = self._call_start()
        if start is not None:
            self.holding = True
            end = start
        elif self._may_be_bare_call():
            return []
        else:
            end = len(self.text) - self._possible_open_tag_len()
        if self.fmt == "hermes":  # whitespace before a call is not content: held back
            end = len(self.text[:end].rstrip())
        return self._content_until(end)

    def finish(self) -> tuple[list[dict[str, Any]], bool]:
        """(the remaining deltas, whether the answer held tool calls)."""
        content, calls = parse_tool_calls(self.text, self.fmt, self.tool_names)
        if not calls:
            return self._content_until(len(self.text)), False
        deltas = self._content_until(len(content)) if len(content) > self.num_content_sent else []
        for index, call in enumerate(calls):
            opening = call.as_openai(index)
            opening["function"] = {"name": call.name, "arguments": ""}
            deltas.append({"tool_calls": [opening]})
            for i in range(0, len(call.arguments), ARGUMENT_FRAGMENT_CHARS):
                fragment = call.arguments[i:i + ARGUMENT_FRAGMENT_CHARS]
                deltas.append({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
        self.num_calls = len(calls)
        return deltas, True

    def _content_until(self, end: int) -> list[dict[str, Any]]:
        if end <= self.num_content_sent:
            return []
        piece = self.text[self.num_content_sent:end]
        self.num_content_sent = end
        return [{"content": piece}]

    def _call_start(self) -> int | None:
        if self.fmt == "hermes":
            found = self.text.find(_HERMES_OPEN)
            return None if found < 0 else found
        stripped = self.text.lstrip()
        if stripped.startswith("{") or stripped.startswith("<|python_tag|>"):
            return 0
        if self.fmt == "llama4" and starts_pythonic(stripped):
            return 0
        return None

    def _may_be_bare_call(self) -> bool:
        """Whether the answer so far may still become a bare or fenced JSON call (hermes,
        with tools): it opens with ``{`` or a ```json / ``` fence, or is a prefix of one."""
        if self.fmt != "hermes" or not self.tool_names or self.num_content_sent:
            return False
        head = self.text.lstrip()
        if head.startswith("{"):
            return True
        fence, newline, rest = head.partition("\n")
        if not newline:  # the fence's first line is not finished
            return "```json".startswith(fence) or fence.startswith("```json") or fence == "```"
        return fence.strip() in ("```", "```json") and (not rest.strip() or rest.lstrip().startswith("{"))

    def _possible_open_tag_len(self) -> int:
        """How many trailing characters could begin a call opening (held back)."""
        if self.fmt != "hermes":
            return len(self.text) if not self.text.strip() else 0
        for n in range(min(len(_HERMES_OPEN) - 1, len(self.text)), 0, -1):
            if _HERMES_OPEN.startswith(self.text[-n:]):
                return n
        return 0


class LiveHermesStream:
    """Grammar-enforced hermes calls streamed as they are written (see the module
    docstring); the same ``add`` / ``finish`` interface as ToolCallStream."""

    def __init__(self) -> None:
        self.text = ""
        self.position = 0  # characters of text fully handled
        self.state = "content"  # content -> header -> arguments -> content ...
        self.num_calls = 0
        self.num_arguments_sent = 0  # of the current call, from self.position

    def add(self, delta_text: str) -> list[dict[str, Any]]:
        self.text += delta_text
        return self._advance(final=False)

    def finish(self) -> tuple[list[dict[str, Any]], bool]:
        deltas = self._advance(final=True)
        return deltas, self.num_calls > 0

    def _advance(self, final: bool) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        while True:
            if self.state == "content":
                start = self.text.find(_HERMES_OPEN, self.position)
                if start < 0:
                    # text outside calls: only whitespace between calls, under the grammar
                    return deltas
                self.position, self.state = start + len(_HERMES_OPEN), "header"
            if self.state == "header":
                header = _HERMES_HEADER.match(self.text, self.position)
                if header is None:
                    return deltas
                deltas.append({"tool_calls": [{
                    "index": self.num_calls, "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function", "function": {"name": header.group(1), "arguments": ""}}]})
                self.position, self.state, self.num_arguments_sent = header.end(), "arguments", 0
            close = self.text.find(_HERMES_CLOSE, self.position)
            if close < 0 and not final:
                end = len(self.text) - _LIVE_HOLD_BACK
                deltas += self._arguments_until(end)
                return deltas
            body_end = close if close >= 0 else len(self.text)
            arguments = self.text[self.position:body_end].rstrip()
            arguments = arguments[:-1].rstrip() if arguments.endswith("}") else arguments
            deltas += self._arguments_until(self.position + len(arguments))
            self.num_calls += 1
            self.state = "content"
            self.position = body_end + len(_HERMES_CLOSE) if close >= 0 else len(self.text)
            if close < 0:
                return deltas

    def _arguments_until(self, end: int) -> list[dict[str, Any]]:
        start = self.position + self.num_arguments_sent
        if end <= start:
            return []
        self.num_arguments_sent = end - self.position
        return [{"tool_calls": [{"index": self.num_calls,
                                 "function": {"arguments": self.text[start:end]}}]}]
