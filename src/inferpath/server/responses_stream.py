"""The Responses API's stream: typed events with consecutive ``sequence_number``.

The order, as OpenAI sends it and the ``openai`` client's ``responses.stream()``
accumulates it::

    response.created            (status in_progress, no output)
    response.in_progress
    per output item, in output_index order:
      reasoning:      response.output_item.added (status in_progress, no content)
                      response.content_part.added (reasoning_text, "")
                      response.reasoning_text.delta ...
                      response.reasoning_text.done, response.content_part.done
                      response.output_item.done
      message:        response.output_item.added (status in_progress, no content)
                      response.content_part.added (output_text, "")
                      response.output_text.delta ...
                      response.output_text.done, response.content_part.done
                      response.output_item.done (status completed)
      function_call:  response.output_item.added (arguments "")
                      response.function_call_arguments.delta ...
                      response.function_call_arguments.done
                      response.output_item.done
    response.completed          (or response.incomplete at max_output_tokens; the whole
                                 response, usage included)

Items are made from the chat deltas of turn.py: content deltas open (or continue) the
message; a tool call's opening delta closes the message and opens a function_call item.
An error mid-stream is one ``error`` event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from inferpath.server.tools import ToolCall

if TYPE_CHECKING:
    from inferpath.server.responses import ResponseDraft
    from inferpath.server.turn import Turn


class ResponseEvents:
    """One streamed response: ``events()`` yields its event payloads in order."""

    def __init__(self, draft: "ResponseDraft", turn: "Turn",
                 keep: Callable[[dict[str, Any], str, list[ToolCall], str | None], None]) -> None:
        self.draft = draft
        self.turn = turn
        self.keep = keep  # stores the finished response (store: true)
        self.sequence_number = 0
        self.output: list[dict[str, Any]] = []  # items in output_index order
        self.message: dict[str, Any] | None = None  # the open message item
        self.message_text = ""
        self.reasoning: dict[str, Any] | None = None  # the reasoning item, once opened
        self.reasoning_text = ""
        self.calls: dict[int, dict[str, Any]] = {}  # chat call index -> open function_call item

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event

    def error_event(self, exc: Exception) -> dict[str, Any]:
        return self._event("error", code=getattr(exc, "code", None) or "server_error",
                           message=str(exc), param=getattr(exc, "param", None))

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        from inferpath.server.responses import (
            count_reasoning_tokens,
            message_item,
            response_status,
            response_usage,
        )

        opening = self.draft.response("in_progress", [], None)
        yield self._event("response.created", response=opening)
        yield self._event("response.in_progress", response=opening)
        async for delta in self.turn.deltas():
            if "reasoning" in delta:
                for event in self._reasoning_delta(delta["reasoning"]):
                    yield event
            if "content" in delta or "tool_calls" in delta:
                for event in self._close_reasoning("completed"):
                    yield event
            if "content" in delta:
                if self.message is None:
                    self.message = message_item("", "in_progress")
                    self.message["content"] = []
                    for event in self._open(self.message):
                        yield event
                    yield self._event("response.content_part.added", **self._where(self.message),
                                      content_index=0, part=self._part(""))
                self.message_text += delta["content"]
                yield self._event("response.output_text.delta", **self._where(self.message),
                                  content_index=0, delta=delta["content"], logprobs=[])
            for call in delta.get("tool_calls", ()):
                for event in self._call_delta(call):
                    yield event
        if self.reasoning is None and self.turn.reasoning is not None:  # reasoned, but empty
            for event in self._reasoning_delta(""):
                yield event
        if self.message is None and not self.calls:  # an empty answer is an empty message
            self.message = message_item("", "in_progress")
            self.message["content"] = []
            for event in self._open(self.message):
                yield event
            yield self._event("response.content_part.added", **self._where(self.message),
                              content_index=0, part=self._part(""))
        status = response_status(self.turn.finish_reason)
        for event in self._close_reasoning("incomplete" if status == "incomplete" else "completed"):
            yield event
        for event in self._close_message("incomplete" if status == "incomplete" else "completed"):
            yield event
        calls = []
        for index in sorted(self.calls):
            item = self.calls[index]
            item["status"] = "completed"
            yield self._event("response.function_call_arguments.done", **self._where(item),
                              name=item["name"], arguments=item["arguments"])
            yield self._event("response.output_item.done", output_index=item["_index"],
                              item=self._public(item))
            flat = f"{item['namespace']}.{item['name']}" if "namespace" in item else item["name"]
            calls.append(ToolCall(flat, item["arguments"], item["call_id"]))
        output = [self._public(item) for item in self.output]
        usage = response_usage(self.turn.final_usage(),
                               count_reasoning_tokens(self.draft.context, self.turn.reasoning))
        final = self.draft.response(status, output, usage, self.turn.finish_reason)
        self.keep(final, self.message_text, calls, self.turn.reasoning)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        yield self._event(kind, response=final)

    def _reasoning_delta(self, text: str) -> list[dict[str, Any]]:
        from inferpath.server.responses import reasoning_item

        events = []
        if self.reasoning is None:
            self.reasoning = reasoning_item("", "in_progress")
            self.reasoning["content"] = []
            events += self._open(self.reasoning)
            events.append(self._event("response.content_part.added", **self._where(self.reasoning),
                                      content_index=0, part=self._reasoning_part("")))
        if text:
            self.reasoning_text += text
            events.append(self._event("response.reasoning_text.delta", **self._where(self.reasoning),
                                      content_index=0, delta=text))
        return events

    def _close_reasoning(self, status: str) -> list[dict[str, Any]]:
        if self.reasoning is None or self.reasoning["status"] != "in_progress":
            return []
        item, text = self.reasoning, self.reasoning_text
        item["status"] = status
        item["content"] = [self._reasoning_part(text)]
        return [self._event("response.reasoning_text.done", **self._where(item), content_index=0,
                            text=text),
                self._event("response.content_part.done", **self._where(item), content_index=0,
                            part=self._reasoning_part(text)),
                self._event("response.output_item.done", output_index=item["_index"],
                            item=self._public(item))]

    @staticmethod
    def _reasoning_part(text: str) -> dict[str, Any]:
        return {"type": "reasoning_text", "text": text}

    def _call_delta(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events = []
        index = call["index"]
        if "id" in call:  # the call's opening delta: name and id
            events += self._close_message("completed")
            item = self.draft.function_call_item(call["id"], call["function"]["name"], "",
                                                 status="in_progress")
            self.calls[index] = item
            events += self._open(item)
        fragment = (call.get("function") or {}).get("arguments") or ""
        if fragment:
            item = self.calls[index]
            item["arguments"] += fragment
            events.append(self._event("response.function_call_arguments.delta",
                                      **self._where(item), delta=fragment))
        return events

    def _open(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        item["_index"] = len(self.output)
        self.output.append(item)
        return [self._event("response.output_item.added", output_index=item["_index"],
                            item=self._public(item))]

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        if self.message is None or self.message["status"] != "in_progress":
            return []
        item, text = self.message, self.message_text
        item["status"] = status
        item["content"] = [self._part(text)]
        return [self._event("response.output_text.done", **self._where(item), content_index=0,
                            text=text, logprobs=[]),
                self._event("response.content_part.done", **self._where(item), content_index=0,
                            part=self._part(text)),
                self._event("response.output_item.done", output_index=item["_index"],
                            item=self._public(item))]

    @staticmethod
    def _part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    @staticmethod
    def _where(item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": item["_index"]}

    @staticmethod
    def _public(item: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in item.items() if not k.startswith("_")}
