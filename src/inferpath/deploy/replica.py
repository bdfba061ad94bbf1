"""One engine replica as a Ray Serve deployment: an AsyncEngine with its own KV cache behind
the server's own FastAPI app, called over ASGI from the ingress.

The replica re-implements no route: ``handle_http`` runs one HTTP request through
``inferpath.server.app.build_app``'s app in process (an ASGI call with the request's
method, path, headers and body) and streams back what the app sends: first the head
``{"status", "headers", "replica"}``, then the body chunks as they are produced, so an SSE
stream is forwarded event by event. When the caller goes away (the ingress's client
disconnected, the Ray generator is cancelled) the app sees ``http.disconnect`` and aborts
the engine request, as it does under uvicorn.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict
from typing import Any, AsyncIterator

from ray import serve


@serve.deployment
class EngineReplica:
    """An ``LLMEngine`` loaded from ``model`` with ``EngineConfig(**engine_config)``, named
    ``name`` (the ``replica`` label in metrics, traces and headers)."""

    def __init__(self, name: str, model: str, engine_config: dict[str, Any],
                 served_model_name: list[str] | None = None,
                 app_options: dict[str, Any] | None = None) -> None:
        import torch

        from inferpath.config import EngineConfig
        from inferpath.engine import AsyncEngine, LLMEngine
        from inferpath.models import served_model_names
        from inferpath.server.app import build_app

        config = EngineConfig(**engine_config)
        if config.threads is not None:
            torch.set_num_threads(config.threads)  # declared per replica, never guessed
        self.name = name
        engine = LLMEngine.from_model(model, config)
        self.async_engine = AsyncEngine(engine)
        # the serve flags of the app itself (api key, CORS, reasoning parser, ...): each
        # replica's app enforces them, the ingress forwards the headers they read
        self.app = build_app(self.async_engine,
                             served_model_name=served_model_name or served_model_names(model),
                             **(app_options or {}))
        self._started = asyncio.Lock()
        self._doors_open = asyncio.Event()  # cleared by hold(True): see hold
        self._doors_open.set()
        self.num_held = 0

    async def _ensure_started(self) -> None:
        # NOTE: the app's lifespan (which starts the engine loop) is not run by an ASGI call;
        # the loop starts here, on the replica's event loop, at the first request.
        async with self._started:
            if not self.async_engine.is_running:
                await self.async_engine.start()

    async def handle_http(self, method: str, path: str, query: str,
                          headers: list[tuple[str, str]], body: bytes) -> AsyncIterator[Any]:
        """Serve one request through the app: yield the head dict, then body ``bytes``."""
        await self._ensure_started()
        if not self._doors_open.is_set():
            self.num_held += 1
            try:
                await self._doors_open.wait()
            finally:
                self.num_held -= 1
        sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        disconnected = asyncio.Event()
        received = False

        async def receive() -> dict[str, Any]:
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            await sent.put(message)

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": query.encode(), "root_path": "",
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
        }
        task = asyncio.create_task(self.app(scope, receive, send))
        try:
            while True:
                getter = asyncio.create_task(sent.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    if sent.empty():
                        task.result()  # raises what the app raised
                        return
                    message = sent.get_nowait()
                else:
                    message = getter.result()
                if message["type"] == "http.response.start":
                    yield {"status": message["status"], "replica": self.name,
                           "headers": [(k.decode("latin-1"), v.decode("latin-1"))
                                       for k, v in message.get("headers", [])]}
                elif message["type"] == "http.response.body":
                    if message.get("body"):
                        yield bytes(message["body"])
                    if not message.get("more_body", False):
                        return
        finally:
            disconnected.set()  # the app aborts its engine request when the caller left
            if not task.done():
                try:
                    await asyncio.wait_for(task, timeout=10)
                except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - the caller is gone
                    task.cancel()

    async def hold(self, held: bool) -> int:
        """While ``held``, requests that arrive wait here, before the app sees them: nothing
        is sent back and the engine never gets them. The fault tests' hook (a replica killed
        while requests are inside it, not started); ``hold(False)`` lets them in. Returns how
        many wait now."""
        if held:
            self._doors_open.clear()
        else:
            self._doors_open.set()
        return self.num_held

    async def stats(self) -> dict[str, Any]:
        """The engine's occupancy and prefix-cache counters (EngineStats), named; ``num_held``:
        requests waiting at ``hold``."""
        stats = asdict(self.async_engine.engine.stats())
        return {"replica": self.name, "pid": os.getpid(), "num_held": self.num_held, **stats}

    async def metrics(self) -> str:
        """This replica's Prometheus text (the app's own registry)."""
        return self.app.state.context.metrics.render().decode("utf-8")

    async def actor_name(self) -> str:
        """The Ray actor's name (``ray.get_actor(name, namespace="serve")`` finds it)."""
        import ray

        return ray.get_runtime_context().get_actor_name()
