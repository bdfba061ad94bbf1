"""Server-sent events with an ``event:`` line: the Responses and Messages streams.

Unlike chat's stream (sse.py) these name each event (``event: response.output_text.delta``)
and end without ``data: [DONE]``: the last event (``response.completed``, ``message_stop``)
says the stream is over. An error after the stream started is one last event, shaped by
the API's ``error_event(exc)``; the cleanup callback runs however the stream ends.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable

from fastapi.responses import StreamingResponse


def named_event(payload: dict[str, Any]) -> str:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {payload['type']}\ndata: {data}\n\n"


async def _named_events(events: AsyncIterator[dict[str, Any]], on_close: Callable[[], None],
                        error_event: Callable[[Exception], dict[str, Any]]) -> AsyncIterator[str]:
    try:
        async for event in events:
            yield named_event(event)
    except Exception as exc:  # noqa: BLE001 - reported to the client, never raised into uvicorn
        yield named_event(error_event(exc))
    finally:
        on_close()


def named_event_response(events: AsyncIterator[dict[str, Any]], on_close: Callable[[], None],
                         error_event: Callable[[Exception], dict[str, Any]]) -> StreamingResponse:
    return StreamingResponse(
        _named_events(events, on_close, error_event),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
