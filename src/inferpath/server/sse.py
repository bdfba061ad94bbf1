"""Server-sent events: one ``data: {json}`` event per chunk, ``data: [DONE]`` at the end.

``stream_events`` wraps a chunk generator into the event stream and guarantees the
cleanup callback runs however the stream ends: finished, failed, or cancelled because
the client went away (Starlette cancels the response task when it sees the disconnect).
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from inferpath.server.errors import error_body

DONE_EVENT = "data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def stream_events(chunks: AsyncIterator[dict[str, Any]],
                        on_close: Callable[[], None]) -> AsyncIterator[str]:
    """Yield each chunk as an SSE event, then ``[DONE]``.

    An error after the stream started cannot change the HTTP status any more, so it is
    sent as one event in OpenAI's error shape before ``[DONE]``. ``on_close`` (which
    aborts unfinished engine requests) runs in every case, cancellation included.
    """
    try:
        async for chunk in chunks:
            yield sse_event(chunk)
        yield DONE_EVENT
    except Exception as exc:  # noqa: BLE001 - reported to the client, never raised into uvicorn
        status = getattr(exc, "status", 500)
        yield sse_event(error_body(status, str(exc), getattr(exc, "param", None)))
        yield DONE_EVENT
    finally:
        on_close()


def sse_response(chunks: AsyncIterator[dict[str, Any]],
                 on_close: Callable[[], None]) -> StreamingResponse:
    return StreamingResponse(
        stream_events(chunks, on_close),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
