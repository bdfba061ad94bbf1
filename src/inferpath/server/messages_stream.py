"""Anthropic's message stream, made from the chat deltas of turn.py::

    message_start        (the message, no content; usage: the prompt's tokens)
    ping
    per content block, index 0, 1, ...:
      content_block_start  (thinking "" | text "" | tool_use with id, name, input {})
      content_block_delta  (thinking_delta | text_delta | input_json_delta: fragments of
                            the input JSON)
      content_block_stop
    message_delta        (stop_reason, stop_sequence; usage: the final counts)
    message_stop

and a ``ping`` whenever ``PING_SECONDS`` pass without an event (a long prompt's prefill
can take minutes on a CPU; clients such as Claude Code give up on a silent stream).

Content deltas open (or continue) a text block; a tool call's opening delta closes the
open block and starts a tool_use block, whose argument fragments follow as
``input_json_delta``. An error mid-stream is one ``error`` event.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, AsyncIterator

if TYPE_CHECKING:
    from inferpath.server.turn import Turn

#: Seconds of silence after which the stream sends a ``ping``.
PING_SECONDS = 10.0


async def with_pings(deltas: AsyncIterator[dict[str, Any]],
                     interval: float) -> AsyncIterator[dict[str, Any] | None]:
    """``deltas``, with a None each time ``interval`` seconds pass without one. The deltas
    are read by a task of their own, cancelled (which aborts the engine request) if the
    consumer stops early."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for delta in deltas:
                await queue.put(("delta", delta))
            await queue.put(("end", None))
        except Exception as exc:  # noqa: BLE001 - re-raised in the consumer
            await queue.put(("error", exc))

    task = asyncio.create_task(pump())
    try:
        while True:
            try:
                kind, value = await asyncio.wait_for(queue.get(), interval)
            except asyncio.TimeoutError:
                yield None
                continue
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        task.cancel()


class MessageEvents:
    """One streamed message: ``events()`` yields its event payloads in order."""

    def __init__(self, message_id: str, model: str, turn: "Turn", stop_sequences: list[str]) -> None:
        self.message_id = message_id
        self.model = model
        self.turn = turn
        self.stop_sequences = stop_sequences
        self.num_blocks = 0
        self.open_kind: str | None = None  # "thinking" | "text" | "tool_use" | None

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        from inferpath.server.messages import message_usage, stop_details, thinking_block, tool_use_id

        yield {"type": "message_start", "message": {
            "id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": len(self.turn.prompt_ids), "output_tokens": 0,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}}
        yield {"type": "ping"}
        async for delta in with_pings(self.turn.deltas(), PING_SECONDS):
            if delta is None:
                yield {"type": "ping"}
                continue
            if delta.get("reasoning"):
                if self.open_kind != "thinking":
                    for event in self._open(thinking_block("")):
                        yield event
                yield self._delta({"type": "thinking_delta", "thinking": delta["reasoning"]})
            if delta.get("content"):
                if self.open_kind != "text":
                    for event in self._open({"type": "text", "text": ""}):
                        yield event
                yield self._delta({"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls", ()):
                if "id" in call:
                    block = {"type": "tool_use", "id": tool_use_id(call["id"]),
                             "name": call["function"]["name"], "input": {}}
                    for event in self._open(block):
                        yield event
                fragment = (call.get("function") or {}).get("arguments") or ""
                if fragment:
                    yield self._delta({"type": "input_json_delta", "partial_json": fragment})
        for event in self._close():
            yield event
        stop_reason, stop_sequence = stop_details(self.turn.finish_reason, self.turn.stop_reason,
                                                  self.stop_sequences)
        yield {"type": "message_delta",
               "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
               "usage": message_usage(self.turn.final)}
        yield {"type": "message_stop"}

    def _open(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self.open_kind = block["type"]
        events.append({"type": "content_block_start", "index": self.num_blocks,
                       "content_block": block})
        return events

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.num_blocks, "delta": delta}

    def _close(self) -> list[dict[str, Any]]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        self.num_blocks += 1
        return [{"type": "content_block_stop", "index": self.num_blocks - 1}]
