"""Autoscaling on queue depth: the ingress wakes spare replicas, Serve starts and stops them.

Replicas ``engine-min .. engine-(max-1)`` are spares: each is a Serve deployment
autoscaled between 0 and 1 replica on its ongoing requests (app.py), so Serve owns the
processes (start, restart, scale to zero after it idled ``scale_down_after_s``). The
ingress owns the decision to add one, because it sees the queue: when every running
replica has ``target_ongoing_requests`` requests in flight, ``Router.spare_to_wake``
names the first cold spare and ``Spares.wake`` sends it one ``stats`` call. That call
is the request Serve scales it from zero for; no client request waits for the cold start
(they keep going to the running replicas, or wait at the ingress when those are full).
When the call answers, the router learns the spare (``mark_warm``) and routes to it.

Serve scales an idle spare back to zero on its own; ``Spares.watch`` reads Serve's status
every ``interval_s`` and makes the router forget a spare that no longer runs
(``mark_cold`` drops its prefix set), so nothing is routed to a replica that is gone and
nothing the ingress sends wakes it by accident (/health, /metrics and the probe skip
cold spares). A request already on its way to a spare Serve is stopping is not lost:
Serve's handle queues it and starts the spare again (or the replica fails before its
first byte and the ingress retries it elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from ray import serve

from inferpath.deploy.routing import Router

logger = logging.getLogger("inferpath.deploy")


def _running_replicas(app_name: str, names: list[str]) -> dict[str, int]:
    """How many RUNNING replicas Serve has of each deployment in ``names`` (blocking)."""
    application = serve.status().applications.get(app_name)
    counts = {name: 0 for name in names}
    if application is None:
        return counts
    for name in names:
        deployment = application.deployments.get(name)
        if deployment is not None:
            states = {getattr(k, "value", k): v for k, v in deployment.replica_states.items()}
            counts[name] = states.get("RUNNING", 0)
    return counts


class Spares:
    """Wakes the spares the router asks for and follows Serve's scaling of them.

    Invariant: a spare is warm in the router only after it answered a call (woken) or Serve
    reported it RUNNING; it turns cold only when Serve reports no running replica of it and
    the ingress has no request in flight there.
    """

    def __init__(self, router: Router, handles: dict[str, Any], changed: Callable[[], Awaitable[None]],
                 wake_timeout_s: float = 600.0, interval_s: float = 1.0) -> None:
        self.router = router
        self.handles = handles
        self.changed = changed  # the ingress's "wake the requests waiting for a replica"
        self.wake_timeout_s = wake_timeout_s
        self.interval_s = interval_s
        self.events: list[dict[str, Any]] = []  # (time, replica, what): started, stopped, failed
        self._tasks: set[asyncio.Task] = set()

    def maybe_wake(self, now: float) -> None:
        """Start the spare the router names (the queue is deep), in the background."""
        name = self.router.spare_to_wake()
        if name is not None:
            logger.warning("queue deep on every running replica; starting spare %s", name)
            self.events.append({"time": now, "replica": name, "event": "waking"})
            task = asyncio.create_task(self._wake(name))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _wake(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self.handles[name].stats.remote(), timeout=self.wake_timeout_s)
        except Exception as exc:  # noqa: BLE001 - it stays cold; the next deep queue tries again
            logger.warning("spare %s did not start (%r)", name, exc)
            self.router.mark_cold(name)
            self.events.append({"time": loop.time(), "replica": name, "event": "failed"})
            return
        self.router.mark_warm(name)
        self.events.append({"time": loop.time(), "replica": name, "event": "started"})
        await self.changed()

    async def watch(self, app_name: str) -> None:
        """Follow Serve's replica counts of the spares, forever."""
        spares = list(self.router.spares)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                running = await asyncio.to_thread(_running_replicas, app_name, spares)
            except Exception as exc:  # noqa: BLE001 - the controller is busy; ask again
                logger.warning("could not read Serve's status (%r)", exc)
                continue
            learned = False
            for name in spares:
                if running[name] and name in self.router.cold and name not in self.router.waking:
                    self.router.mark_warm(name)  # Serve runs it (kept it up, or restarted it)
                    learned = True
                    self.events.append({"time": loop.time(), "replica": name, "event": "started"})
                elif (not running[name] and name not in self.router.cold
                      and self.router.inflight[name] == 0):
                    self.router.down.discard(name)  # a stopped spare is cold, not broken
                    self.router.mark_cold(name)
                    logger.warning("spare %s scaled to zero; routing forgets it", name)
                    self.events.append({"time": loop.time(), "replica": name, "event": "stopped"})
            if learned:
                await self.changed()
