"""The glass box on the server: the page at ``/`` and the traces it draws.

- ``GET /`` and ``GET /glassbox/*``: the page (server/static/, shipped in the package, no
  build step).
- A completion (``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` or
  ``/v1/messages``) sent with the header
  ``X-Inferpath-Trace: 1`` is traced: the engine's StepTracer is held (engine/trace.py)
  from before the request is submitted until its response has been sent, so every step
  it takes part in is recorded. The response itself is the plain OpenAI one; a client
  that does not send the header is never traced by its own request and never sees a trace.
- Tracing is on or off per server (``install_trace_routes(..., tracing=...)``; ``inferpath
  serve --trace on|off``, on by default when bound to a loopback address, off otherwise):
  off, nothing is ever attached to the engine, a completion asking for a trace is still
  answered (untraced) and its response says so in the header ``X-Inferpath-Trace: off``
  (``X-Inferpath-Trace-Reason`` says how to turn it on), and ``GET /v1/trace/{id}`` is a
  403 ``trace_disabled`` naming the flag. On, a traced completion's response carries
  ``X-Inferpath-Trace: on``.
- ``GET /v1/trace/{id}``: the trace of the completion whose response ``id`` is given
  (explain/trace.py ``request_trace``: steps, stage rows measured and predicted, tokens with
  their top 5, KV cache, the batch each step shared), live while it runs. The prediction
  is for ``this-machine``, probed once (cached on disk) on first use.

Only counts of other requests' sequences and tokens appear in a trace, never their text.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from inferpath.explain.hardware import HARDWARE_PRESETS, THIS_MACHINE, get_hardware
from inferpath.server.errors import APIError

STATIC_DIR = Path(__file__).with_name("static")
TRACE_HEADER = b"x-inferpath-trace"
TRACE_OFF_REASON = "tracing is off on this server: start it with 'inferpath serve --trace on'"
_TRACED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")


def _with_headers(send, headers: list[tuple[bytes, bytes]]):
    """``send`` that adds ``headers`` to the response's start."""
    async def sending(message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *headers]}
        await send(message)
    return sending


class TraceOnHeader:
    """ASGI middleware: holds the tracer for the whole of a completion that asks for it, and
    says in the response's ``X-Inferpath-Trace`` header whether it was traced. ``tracer``
    None: tracing is off on this server (``off_reason`` says why), nothing is held."""

    def __init__(self, app, tracer, off_reason: str = TRACE_OFF_REASON) -> None:
        self.app = app
        self.tracer = tracer
        self.off_reason = off_reason

    async def __call__(self, scope, receive, send) -> None:
        if not (scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in _TRACED_PATHS
                and dict(scope["headers"]).get(TRACE_HEADER, b"").strip() in (b"1", b"true", b"on")):
            await self.app(scope, receive, send)
            return
        if self.tracer is None:  # asked, refused: answered untraced, and the response says so
            await self.app(scope, receive, _with_headers(send, [
                (TRACE_HEADER, b"off"), (b"x-inferpath-trace-reason", self.off_reason.encode("latin-1"))]))
            return
        self.tracer.acquire()
        try:
            await self.app(scope, receive, _with_headers(send, [(TRACE_HEADER, b"on")]))
        finally:
            await asyncio.to_thread(self.tracer.release)  # may wait for a traced step to end


def install_trace_routes(app: FastAPI, context: Any, api_key: str | None = None,
                         tracing: bool = True) -> None:
    """Add the page, the trace header's middleware and ``/v1/trace/{id}`` to ``app``, serving
    ``context``'s engine (engine_client.ServingContext: the routes reach the engine and its
    tracer only through it); ``tracing`` False: no request can turn the engine's trace on
    (module doc)."""
    from inferpath.engine.trace import tracer_of
    from inferpath.explain.trace import request_trace

    untraceable, status, code = TRACE_OFF_REASON, 403, "trace_disabled"
    if tracing:
        try:
            context.tracer = tracer_of(context.async_engine.engine)
        except ValueError as exc:  # tensor parallelism: the page chats, without a trace
            untraceable, status, code = f"this server cannot trace: {exc}", 400, "trace_unavailable"
    hardware_holder: list = []

    async def hardware():
        if not hardware_holder:
            from inferpath.explain.trace import machine_for  # the probe, with the GEMV shapes cached

            hardware_holder.append(await asyncio.to_thread(machine_for, context.async_engine.engine, False, False))
        return hardware_holder[0]

    app.add_middleware(TraceOnHeader, tracer=context.tracer, off_reason=untraceable)
    app.mount("/glassbox", StaticFiles(directory=STATIC_DIR), name="glassbox")

    @app.get("/v1/trace-hardware", include_in_schema=False)
    async def trace_hardware() -> JSONResponse:
        """The hardware a trace can be priced on: this machine, then the presets."""
        return JSONResponse({"hardware": [THIS_MACHINE, *HARDWARE_PRESETS]})

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    @app.get("/v1/trace/{response_id}")
    async def get_trace(response_id: str, request: Request, hardware_name: str = Query(
            THIS_MACHINE, alias="hardware")) -> JSONResponse:
        """The request's trace priced on this machine, or re-priced on a preset
        (``?hardware=h100-sxm``): the same stages and tokens, the cost model's figures for
        that hardware (as ``inferpath explain`` gives them for the same shapes)."""
        _check_key(request, api_key)
        tracer = context.tracer
        if tracer is None:
            raise APIError(status, untraceable, code=code)
        preset = None
        if hardware_name != THIS_MACHINE:
            try:
                preset = get_hardware(hardware_name)
            except ValueError as exc:
                raise APIError(400, str(exc), param="hardware", code="unknown_hardware") from None
        # resp_... and msg_... (Responses, Messages) are the engine's resp-... and msg-...
        engine_id = response_id.replace("_", "-", 1) if response_id.startswith(("resp_", "msg_")) \
            else response_id
        for request_id in (engine_id, f"{engine_id}-0"):
            if tracer.steps_of(request_id):
                spec = preset or await hardware()
                trace = request_trace(tracer, request_id, context.async_engine.engine, spec)
                if trace["probe_stale"] and spec.name == THIS_MACHINE:  # measured again on next load
                    from inferpath.explain.probe import note_observed

                    await asyncio.to_thread(note_observed, trace["probe_stale"]["attained_read_bandwidth"])
                return JSONResponse(trace)
        raise APIError(404, f"no trace of {response_id!r}: send the completion with the header "
                       "'X-Inferpath-Trace: 1' (traces are kept for the last 4,096 steps)",
                       param="id", code="trace_not_found")


def _check_key(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    # as app.py: the raw header bytes (Starlette decodes latin-1, losslessly) against UTF-8
    scheme, _, token = request.headers.get("authorization", "").encode("latin-1").partition(b" ")
    if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), api_key.encode("utf-8")):
        raise APIError(401, "missing or incorrect API key: send 'Authorization: Bearer <key>'",
                       code="invalid_api_key")
