"""Streaming a chat answer that may hold tool calls, as OpenAI streams it.

Content is streamed as it comes until the model starts a call (``<tool_call>`` for the
hermes syntax; for llama3_json an answer that opens with ``{`` or ``<|python_tag|>``);
from there the text is held until the choice finishes, then parsed, and each call goes out
as OpenAI sends it: one delta with the call's index, id, type, name and empty arguments,
then the arguments in fragments (``delta.tool_calls[].function.arguments``), which
concatenate to the full JSON.

NOTE: argument fragments are sent when the call is complete, not token by token: a call
is only known to be well-formed (and parsed) once it is closed.
"""

from __future__ import annotations

from typing import Any

from inferpath.server.tools import parse_tool_calls

#: Characters of arguments JSON per streamed fragment.
ARGUMENT_FRAGMENT_CHARS = 16
_HERMES_OPEN = "<tool_call>"


class ToolCallStream:
    """One choice's text deltas in, OpenAI deltas out (see the module docstring)."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
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
        else:
            end = len(self.text) - self._possible_open_tag_len()
        return self._content_until(end)

    def finish(self) -> tuple[list[dict[str, Any]], bool]:
        """(the remaining deltas, whether the answer held tool calls)."""
        content, calls = parse_tool_calls(self.text, self.fmt)
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
        return None

    def _possible_open_tag_len(self) -> int:
        """How many trailing characters could begin a call opening (held back)."""
        if self.fmt != "hermes":
            return len(self.text) if not self.text.strip() else 0
        for n in range(min(len(_HERMES_OPEN) - 1, len(self.text)), 0, -1):
            if _HERMES_OPEN.startswith(self.text[-n:]):
                return n
        return 0
