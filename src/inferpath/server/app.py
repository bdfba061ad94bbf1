"""The FastAPI app: OpenAI-compatible routes over one AsyncEngine.

``build_app(async_engine, api_key=None, served_model_name=None)`` returns an app whose
lifespan starts the engine's background loop and shuts it down. Routes:

- ``GET /v1/models``, ``GET /v1/models/{id}``
- ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE when ``stream``)
- ``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``,
  ``GET /v1/responses/{id}/input_items`` (OpenAI's Responses API: responses.py)
- ``POST /v1/messages``, ``POST /v1/messages/count_tokens`` (Anthropic: messages.py)
- ``POST /tokenize``, ``POST /detokenize``
- ``GET /health`` (status and the engine's occupancy), ``GET /metrics`` (Prometheus),
  ``GET /version``
- ``GET /``: the glass-box page, and ``GET /v1/trace/{id}`` (trace_routes.py)

CORS is off unless ``allowed_origins`` lists the origins a browser may call from
(``["*"]`` for any).

With an ``api_key``, the ``/v1`` routes and (de)tokenize need ``Authorization: Bearer
KEY`` or ``x-api-key: KEY`` (Anthropic's header), compared as bytes, in constant time (a
key that is not ASCII works when sent as UTF-8). ``/health`` and ``/metrics`` stay open for probes and scrapers, and so do
``/docs`` and ``/openapi.json``, as in vLLM: they describe the API and hold no data.
``max_n`` caps ``n`` (choices per request; OpenAI's 128 by default).
"""

from __future__ import annotations

import secrets
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from inferpath.server.chat import create_chat_completion, encode_messages
from inferpath.server.completions import create_completion
from inferpath.server.engine_client import DEFAULT_MAX_N, ServingContext, encode_prompt
from inferpath.server.errors import APIError, install_error_handlers
from inferpath.server.messages import install_messages_routes
from inferpath.server.metrics import ServerMetrics
from inferpath.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ParamError,
    TokenizeRequest,
    messages_as_dicts,
)
from inferpath.server.response_store import ResponseStore
from inferpath.server.responses import (
    create_response,
    delete_response,
    get_response,
    list_input_items,
)
from inferpath.server.generation_defaults import checked
from inferpath.server.reasoning import choose_reasoning_parser, format_stop_token_ids
from inferpath.server.responses_protocol import ResponsesRequest
from inferpath.server.trace_routes import install_trace_routes


def build_app(async_engine: Any, api_key: str | None = None,
              served_model_name: str | list[str] | None = None, max_n: int = DEFAULT_MAX_N,
              allowed_origins: list[str] | None = None,
              response_store: ResponseStore | None = None,
              reasoning_parser: str | None = None, tracing: bool = True,
              sampling_defaults: dict[str, Any] | None = None) -> FastAPI:
    """An app serving ``async_engine`` (an ``inferpath.engine.AsyncEngine``) as
    ``served_model_name`` (default: the engine's model name); stored Responses live in
    ``response_store`` (default: a ResponseStore with its default bounds); answers'
    reasoning is split off by ``reasoning_parser`` (default: chosen from the model,
    server/reasoning.py). ``tracing``: whether a request may turn the engine's trace on
    (server/trace_routes.py). ``sampling_defaults``: what a request that leaves a sampling
    field out gets (server/generation_defaults.py; default: OpenAI's)."""
    engine = async_engine.engine
    # several names (vLLM's --served-model-name A B): the first is reported, all accepted
    names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name or ())
    model_name = names[0] if names else engine.model_name
    metrics = ServerMetrics(engine.stats, model_name)
    context = ServingContext(
        async_engine=async_engine,
        tokenizer=engine.tokenizer,
        model_name=model_name,
        max_model_len=engine.max_model_len,
        metrics=metrics,
        api_key=api_key,
        max_n=max_n,
        other_names=tuple(names[1:]),
        reasoning_parser=choose_reasoning_parser(engine.model_config.architecture,
                                                 engine.tokenizer.chat_template, reasoning_parser),
        sampling_defaults=checked(dict(sampling_defaults or {}), "sampling_defaults"),
    )
    context.format_stop_token_ids = format_stop_token_ids(
        context.reasoning_parser, engine.tokenizer, frozenset(engine.eos_token_ids))
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await async_engine.start()
        try:
            yield
        finally:
            await async_engine.shutdown()
            context.executor.shutdown(wait=False, cancel_futures=True)
            context.release()

    app = FastAPI(title="inferpath", lifespan=lifespan)
    app.state.context = context
    if allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins),
                           allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key",
                                          "anthropic-version"])
    install_error_handlers(app, metrics.record_error)

    expected_key = api_key.encode("utf-8") if api_key is not None else b""

    def check_api_key(request: Request) -> None:
        if api_key is None:
            return
        # the raw header bytes: Starlette decodes headers as latin-1, which is lossless
        header = request.headers.get("authorization", "").encode("latin-1")
        scheme, _, token = header.partition(b" ")
        anthropic_key = request.headers.get("x-api-key")
        if anthropic_key is not None and not header:  # Anthropic's clients send this one
            scheme, token = b"bearer", anthropic_key.encode("latin-1")
        elif not header:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>' (or "
                           "'x-api-key: <key>')", code="invalid_api_key")
        if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), expected_key):
            raise APIError(401, "incorrect API key", code="invalid_api_key")

    api = APIRouter(dependencies=[Depends(check_api_key)])

    def model_card() -> dict[str, Any]:
        return {"id": context.model_name, "object": "model", "created": created,
                "owned_by": "inferpath", "max_model_len": context.max_model_len}

    @api.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @api.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        context.check_model(model_id)
        return model_card()

    @api.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await create_completion(body, request, context)

    @api.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await create_chat_completion(body, request, context)

    store = response_store if response_store is not None else ResponseStore()
    app.state.response_store = store

    @api.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        return await create_response(body, request, context, store)

    @api.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str) -> dict[str, Any]:
        return get_response(store, response_id)

    @api.delete("/v1/responses/{response_id}")
    async def remove_response(response_id: str) -> dict[str, Any]:
        return delete_response(store, response_id)

    @api.get("/v1/responses/{response_id}/input_items")
    async def response_input_items(response_id: str, limit: int = 20, order: str = "desc",
                                   after: str | None = None) -> dict[str, Any]:
        return list_input_items(store, response_id, limit, order, after)

    @api.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        context.check_model(body.model)
        tokens = await _tokenize(context, body)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": context.max_model_len}

    @api.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        context.check_model(body.model)
        vocab_size = context.tokenizer.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab_size]
        if bad:
            raise APIError(400, f"tokens holds token id {bad[0]}, out of the vocabulary's "
                           f"range [0, {vocab_size})",
                           param="tokens")
        return {"prompt": context.tokenizer.decode(body.tokens)}

    app.include_router(api)
    install_messages_routes(app, context, check_api_key)  # Anthropic's errors, not OpenAI's

    @app.get("/health")
    async def health() -> dict[str, Any]:
        stats = context.async_engine.engine.stats()
        return {"status": "ok", "model": context.model_name,
                "num_requests_running": stats.num_running,
                "num_requests_waiting": stats.num_waiting,
                "num_kv_blocks_used": stats.num_kv_blocks_used,
                "num_kv_blocks_total": stats.num_kv_blocks_total}

    @app.get("/version")
    async def version() -> dict[str, Any]:
        from inferpath import __version__

        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    install_trace_routes(app, context, api_key, tracing)  # the page at / and /v1/trace/{id}
    return app


async def _tokenize(context: ServingContext, body: TokenizeRequest) -> list[int]:
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "send exactly one of 'prompt' and 'messages'", param="prompt")
    if body.messages is not None:
        try:
            messages = messages_as_dicts(body.messages)
        except ParamError as exc:
            raise APIError(400, str(exc), param=exc.param) from None
        return await encode_messages(context, messages, body.add_generation_prompt)
    add_bos = None if body.add_special_tokens else False
    return await context.run_off_loop(encode_prompt, context, body.prompt, "prompt", add_bos)

