"""The ingress: one OpenAI-compatible HTTP front over N engine replicas (Ray Serve).

Every API route is forwarded, unchanged, to one replica's own FastAPI app
(replica.py ``handle_http``), chosen by the Router (routing.py) from the prompt's text;
the response streams back chunk by chunk. The ingress adds:

- ``x-inferpath-replica`` and ``x-inferpath-route`` response headers: which replica
  served the request and why (prefix match or load), the glass box across replicas;
- ``GET /health``: each replica's status and occupancy (503 when none is up);
- ``GET /metrics``: every replica's metrics with a ``replica`` label, plus the router's
  own (requests routed by replica and reason, requests in flight, replicas up);
- ``GET /v1/router``: the most recent routing decisions;
- ``GET /v1/trace/{id}`` and ``GET``/``DELETE /v1/responses/{id}``: to the replica that
  made response ``id`` (the ingress notes each response's id); a trace gains a
  ``routing`` field: the replica, the reason, the prefix matched and its load.

Faults. A replica that fails before the ingress forwarded any byte of its response (the
request never started for the client) is marked down and the request is retried on
another replica, up to ``max_attempts`` (the response then says ``retried_from=...`` in
``x-inferpath-route``); one that fails mid-stream ends the stream with an error event
(OpenAI's error shape, Anthropic's ``event: error`` on /v1/messages), never a hang. Ray
Serve restarts a dead replica; a probe every ``probe_interval_s`` marks it up again once
it answers.

Spares (autoscaling between min and max replicas): spares.py wakes one when the queue is
deep and follows Serve scaling it down; a cold spare is never called here (a call would
start it).
"""

# NOTE: no `from __future__ import annotations`: FastAPI reads the route signatures of the
# class that @serve.ingress rebuilds, and string annotations are not resolved there.
import asyncio
import collections
import json
import logging
import time
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError, RayError

from inferpath.deploy.metrics_merge import merge_metrics, router_metrics
from inferpath.deploy.owners import ResponseOwners
from inferpath.deploy.prompt_text import routing_text
from inferpath.deploy.routing import POLICIES, RouteDecision, Router
from inferpath.deploy.spares import Spares

logger = logging.getLogger("inferpath.deploy")
ingress_app = FastAPI(title="inferpath (replicas)")
_REPLICA_GONE = (RayActorError, ActorUnavailableError)
_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "host"}


class ReplicaFailed(Exception):
    """A replica died or became unreachable while serving a request."""


# NOTE: defined above the class: @serve.ingress rebuilds the class when it is decorated.
def _is_streaming(head: dict[str, Any]) -> bool:
    return any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in head["headers"])


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""  # noqa: unreachable - makes this an async generator


def _stream_error(path: str, message: str) -> bytes:
    """The event that ends a stream whose replica died: Anthropic's shape on /v1/messages,
    OpenAI's elsewhere (then ``[DONE]``, as the server's own streams end on an error)."""
    if path.startswith("/v1/messages"):
        payload = {"type": "error", "error": {"type": "api_error", "message": message}}
        return f"event: error\ndata: {json.dumps(payload)}\n\n".encode()
    payload = {"error": {"message": message, "type": "server_error", "param": None, "code": 502}}
    return f"data: {json.dumps(payload)}\n\ndata: [DONE]\n\n".encode()


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
@serve.ingress(ingress_app)
class Ingress:
    """Routes requests over ``replicas`` (handles of EngineReplica deployments, named as the
    ``names``); ``router`` holds the Router's settings (routing.Router's keywords)."""

    def __init__(self, names: list[str], router: dict[str, Any], *replicas: Any,
                 max_attempts: int = 3, probe_interval_s: float = 1.0,
                 wait_timeout_s: float = 600.0) -> None:
        if len(names) != len(replicas):
            raise ValueError(f"{len(names)} replica names for {len(replicas)} replicas")
        self.handles = dict(zip(names, replicas))
        self.router = Router(names, **router)
        self.max_attempts = max_attempts
        self.probe_interval_s = probe_interval_s
        self.wait_timeout_s = wait_timeout_s
        self.decisions: collections.deque[dict[str, Any]] = collections.deque(maxlen=256)
        self.owners = ResponseOwners()
        self._freed = asyncio.Condition()
        self._probe_task: asyncio.Task | None = None
        self._watch_task: asyncio.Task | None = None
        self.spares = Spares(self.router, self.handles, self._notify, wake_timeout_s=wait_timeout_s,
                             interval_s=probe_interval_s)
        self.num_retried: dict[str, int] = {name: 0 for name in names}  # failed before a byte

    # ------------------------------------------------------------------ routing
    async def _acquire(self, text: str, exclude: set[str], owner: str | None = None) -> RouteDecision:
        """A replica for ``text``, waiting while every healthy one is full; ``owner`` (the
        replica that made the response this request continues) first while it is healthy."""
        self._ensure_probe()
        deadline = time.monotonic() + self.wait_timeout_s
        async with self._freed:
            while True:
                decision = None
                if owner is not None and owner not in exclude and owner not in self.router.down:
                    decision = self.router.choose_owner(owner, text)
                # a replica tried already is taken again only when no other is free
                decision = decision or self.router.choose(text, exclude) or self.router.choose(text)
                self.spares.maybe_wake(time.monotonic())  # this request may have made the queue deep
                if decision is not None:
                    return decision
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no replica free within {self.wait_timeout_s:g} s")
                try:
                    await asyncio.wait_for(self._freed.wait(), timeout=min(remaining, self.probe_interval_s))
                except asyncio.TimeoutError:
                    pass

    async def _release(self, replica: str) -> None:
        async with self._freed:
            self.router.release(replica)
            self._freed.notify_all()

    def _mark_down(self, replica: str, exc: BaseException) -> None:
        if replica not in self.router.down:
            logger.warning("replica %s failed (%r); marked down until it answers again", replica, exc)
        self.router.mark_down(replica)

    async def _notify(self) -> None:
        async with self._freed:
            self._freed.notify_all()

    def _ensure_probe(self) -> None:
        if self._probe_task is None or self._probe_task.done():
            self._probe_task = asyncio.create_task(self._probe_loop())
        if self.router.spares and (self._watch_task is None or self._watch_task.done()):
            self._watch_task = asyncio.create_task(self.spares.watch(serve.get_replica_context().app_name))

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            for name in list(self.router.down - self.router.cold):  # a call would start a cold spare
                try:
                    await asyncio.wait_for(self.handles[name].stats.remote(), timeout=self.probe_interval_s * 5)
                except (RayError, asyncio.TimeoutError, Exception):  # noqa: BLE001 - still down
                    continue
                async with self._freed:
                    self.router.mark_up(name)
                    self._freed.notify_all()
                logger.warning("replica %s answers again; marked up", name)

    # ------------------------------------------------------------------ forwarding
    async def _open(self, request: Request, body: bytes) -> tuple[RouteDecision, dict, Any, list[bytes], list[str]]:
        """Send the request to a replica; return its decision, head, the rest of its stream,
        the first body chunks read (the stream has started once they are forwarded) and the
        replicas that failed it before any byte (it was retried elsewhere)."""
        text = routing_text(request.url.path, body) if request.method == "POST" else ""
        owner = self.owners.owner_of_previous(request.url.path, body)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS]
        tried: set[str] = set()
        failed: list[str] = []
        last_error: BaseException | None = None
        for _ in range(self.max_attempts):
            decision = await self._acquire(text, tried, owner)
            tried.add(decision.replica)
            stream = self.handles[decision.replica].options(stream=True).handle_http.remote(
                request.method, request.url.path, request.url.query, headers, body)
            head = None
            try:
                head = await stream.__anext__()
                first = [await stream.__anext__()] if _is_streaming(head) else []
            except StopAsyncIteration:
                if head is None:
                    await self._release(decision.replica)
                    raise ReplicaFailed(f"replica {decision.replica} sent no response") from None
                return decision, head, _empty(), [], failed
            except _REPLICA_GONE as exc:
                await self._release(decision.replica)
                self._mark_down(decision.replica, exc)
                self.num_retried[decision.replica] += 1
                failed.append(decision.replica)
                last_error = exc
                continue  # nothing reached the client yet: try another replica
            except BaseException:
                await self._release(decision.replica)
                raise
            return decision, head, stream, first, failed
        raise ReplicaFailed(f"{self.max_attempts} replicas failed this request; last: {last_error!r}")

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        try:
            decision, head, stream, first, failed = await self._open(request, body)
        except (ReplicaFailed, TimeoutError) as exc:
            return JSONResponse({"error": {"message": f"no replica could serve the request: {exc}",
                                           "type": "server_error", "param": None, "code": None}},
                                status_code=503)
        record = {"time": time.time(), "path": request.url.path, "replica": decision.replica,
                  "reason": decision.reason, "matched_chars": decision.matched_chars,
                  "load": decision.load, "retried_from": failed}
        self.decisions.append(record)
        headers = {k: v for k, v in head["headers"] if k.lower() not in _HOP_HEADERS}
        headers["x-inferpath-replica"] = decision.replica
        headers["x-inferpath-route"] = f"{decision.reason}; matched_chars={decision.matched_chars}; load={decision.load}"
        if failed:
            headers["x-inferpath-route"] += f"; retried_from={','.join(failed)}"
        if not _is_streaming(head):
            try:
                chunks = first + [chunk async for chunk in stream]
            except RayError as exc:
                if isinstance(exc, _REPLICA_GONE):
                    self._mark_down(decision.replica, exc)
                return JSONResponse({"error": {"message": f"replica {decision.replica} failed while "
                                               f"answering: {exc!r}", "type": "server_error",
                                               "param": None, "code": None}}, status_code=502)
            finally:
                await self._release(decision.replica)
            self.owners.remember(b"".join(chunks[:1]), record)
            return Response(b"".join(chunks), status_code=head["status"], headers=headers)
        self.owners.remember(b"".join(first), record)
        return StreamingResponse(self._relay(decision, first, stream, request.url.path),
                                 status_code=head["status"], headers=headers)

    async def _forward_owned(self, request: Request, response_id: str) -> Response:
        """A request about one response (its trace, its stored Response): to the replica
        that made it, or, unknown, to each replica until one does not answer 404."""
        record = self.owners.get(response_id)
        names = [record["replica"]] if record else [n for n in self.handles
                                                     if n not in self.router.down | self.router.cold]
        status, headers, body = 404, [], b""
        for name in names:
            try:
                parts = [part async for part in self.handles[name].options(stream=True).handle_http.remote(
                    request.method, request.url.path, request.url.query,
                    [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS], b"")]
            except RayError as exc:
                if isinstance(exc, _REPLICA_GONE):
                    self._mark_down(name, exc)
                continue
            status, headers, body = parts[0]["status"], parts[0]["headers"], b"".join(parts[1:])
            if status != 404:
                break
        out = {k: v for k, v in headers if k.lower() not in _HOP_HEADERS}
        if record and request.url.path.startswith("/v1/trace/") and status == 200:
            trace = json.loads(body)
            trace["routing"] = {k: record[k] for k in ("replica", "reason", "matched_chars", "load",
                                                       "retried_from")}
            body = json.dumps(trace).encode()
        if record:
            out["x-inferpath-replica"] = record["replica"]
        return Response(body, status_code=status, headers=out)

    async def _relay(self, decision: RouteDecision, first: list[bytes], stream: Any,
                     path: str) -> AsyncIterator[bytes]:
        try:
            for chunk in first:
                yield chunk
            async for chunk in stream:
                yield chunk
        except Exception as exc:  # noqa: BLE001 - the client gets an error event, never a hang
            if isinstance(exc, _REPLICA_GONE):
                self._mark_down(decision.replica, exc)
            yield _stream_error(path, f"replica {decision.replica} failed mid-stream: {exc!r}"[:2000])
        finally:
            await self._release(decision.replica)

    def set_policy(self, policy: str) -> str:
        """Switch the routing policy (through the app's handle, not over HTTP: tests and
        benchmarks compare policies on one deployment); returns the previous one."""
        if policy not in POLICIES:
            raise ValueError(f"routing policy {policy!r} is not one of {', '.join(POLICIES)}")
        previous, self.router.policy = self.router.policy, policy
        return previous

    # ------------------------------------------------------------------ routes
    @ingress_app.get("/health")
    async def health(self) -> JSONResponse:
        self._ensure_probe()
        replicas = await asyncio.gather(*(self._replica_health(n) for n in self.handles))
        up = sum(r["status"] == "ok" for r in replicas)
        return JSONResponse({"status": "ok" if up else "unavailable", "num_replicas_up": up,
                             "replicas": replicas}, status_code=200 if up else 503)

    async def _replica_health(self, name: str) -> dict[str, Any]:
        if name in self.router.cold:  # a spare Serve scaled to zero (asking would start it)
            return {"replica": name, "status": "starting" if name in self.router.waking else "scaled_to_zero",
                    "num_requests_inflight": self.router.inflight[name],
                    "num_prefix_chunks_routed": self.router.num_prefix_chunks(name)}
        try:
            stats = await asyncio.wait_for(self.handles[name].stats.remote(), timeout=5)
        except (RayError, asyncio.TimeoutError) as exc:
            return {"replica": name, "status": "down", "error": repr(exc)[:300],
                    "num_requests_inflight": self.router.inflight[name]}
        return {"replica": name, "status": "down" if name in self.router.down else "ok",
                "num_requests_inflight": self.router.inflight[name],
                "num_prefix_chunks_routed": self.router.num_prefix_chunks(name), **stats}

    @ingress_app.get("/metrics")
    async def metrics(self) -> Response:
        async def one(name: str) -> tuple[str, str | None]:
            if name in self.router.cold:
                return name, None
            try:
                return name, await asyncio.wait_for(self.handles[name].metrics.remote(), timeout=5)
            except (RayError, asyncio.TimeoutError):
                return name, None
        texts = dict(await asyncio.gather(*(one(n) for n in self.handles)))
        body = merge_metrics({n: t for n, t in texts.items() if t is not None})
        body += router_metrics(self.router, up={n: t is not None and n not in self.router.down
                                                for n, t in texts.items()}, retried=self.num_retried)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @ingress_app.get("/v1/router")
    async def recent_decisions(self) -> dict[str, Any]:
        return {"policy": self.router.policy, "decisions": list(self.decisions),
                "spares": {"cold": sorted(self.router.cold), "events": self.spares.events[-64:]}}

    @ingress_app.get("/v1/trace/{response_id}")
    async def trace(self, response_id: str, request: Request) -> Response:
        return await self._forward_owned(request, response_id)

    @ingress_app.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"])
    async def stored_response(self, response_id: str, request: Request) -> Response:
        return await self._forward_owned(request, response_id)

    @ingress_app.get("/v1/responses/{response_id}/input_items")
    async def stored_input_items(self, response_id: str, request: Request) -> Response:
        return await self._forward_owned(request, response_id)

    @ingress_app.api_route("/{path:path}", methods=["GET", "POST", "DELETE"])
    async def forward(self, request: Request) -> Response:
        return await self._forward(request)
