"""The Ray Serve application: N engine replicas behind one ingress.

``build_app(model, num_replicas=2, ...)`` returns an application for ``serve.run``;
``app_builder`` is the same for ``serve run inferpath.deploy.app:app_builder model=M
num_replicas=2 ...`` (Ray Serve passes the command line's ``key=value`` pairs as a dict).

Each replica is its own deployment ``engine-i`` (one Ray actor, restarted by Serve when
it dies), so the ingress's router, not Ray's, picks the replica and can say why.
Resources are declared: each replica reserves ``num_cpus`` Ray CPUs and computes with
``threads`` threads (``EngineConfig.threads``).

Autoscaling on queue depth: replicas ``engine-0 .. engine-(min-1)`` always run; replicas
``engine-min .. engine-(max-1)`` are spares, Serve deployments autoscaled between 0 and 1
replica on their ongoing requests, starting at 0. The ingress starts one (spares.py) when
every running replica has ``target_ongoing_requests`` requests in flight, routes to a
running spare only while the queue is that deep, and Serve scales an idle spare back to
zero once the mean of its ongoing requests over 12 s is 0 and ``scale_down_after_s`` more
have passed.
"""

from __future__ import annotations

from typing import Any

from ray import serve

from inferpath.deploy.ingress import Ingress
from inferpath.deploy.replica import EngineReplica


def build_app(model: str, num_replicas: int | None = 2, engine_config: dict[str, Any] | None = None,
              policy: str = "prefix", num_cpus: float = 1.0, threads: int = 1,
              min_replicas: int | None = None, max_replicas: int | None = None,
              target_ongoing_requests: int = 8, max_inflight_per_replica: int = 32,
              scale_down_after_s: float = 60.0,
              served_model_name: list[str] | None = None,
              router_options: dict[str, Any] | None = None,
              app_options: dict[str, Any] | None = None) -> serve.Application:
    """The application: ``num_replicas`` replicas of ``model`` (or between ``min_replicas``
    and ``max_replicas``, autoscaled), each with ``EngineConfig(**engine_config,
    threads=threads)`` on ``num_cpus`` Ray CPUs, routed by ``policy`` ("prefix" or
    "round_robin"); ``app_options`` are ``server.app.build_app``'s keywords for every
    replica's app (``api_key``, ``max_n``, ``allowed_origins``, ``reasoning_parser``,
    ``response_store``, ``tracing``)."""
    if (min_replicas is None) != (max_replicas is None):
        raise ValueError("give both --min-replicas and --max-replicas, or neither")
    if min_replicas is not None:
        if not 1 <= min_replicas <= max_replicas:
            raise ValueError(f"need 1 <= min_replicas ({min_replicas}) <= max_replicas ({max_replicas})")
        num_always, num_total = min_replicas, max_replicas
    else:
        if num_replicas is None or num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        num_always = num_total = num_replicas
    if min_replicas is not None and not 1 <= target_ongoing_requests <= max_inflight_per_replica:
        raise ValueError(f"target_ongoing_requests ({target_ongoing_requests}) must be between 1 and "
                         f"max_inflight_per_replica ({max_inflight_per_replica}): a spare starts when "
                         "every running replica has that many requests in flight")
    if scale_down_after_s <= 0:
        raise ValueError(f"scale_down_after_s must be > 0, got {scale_down_after_s}")
    if threads < 1:
        raise ValueError(f"threads per replica must be >= 1, got {threads}")
    config = {**(engine_config or {}), "threads": threads}
    names, replicas = [], []
    for index in range(num_total):
        name = f"engine-{index}"
        options: dict[str, Any] = {
            "name": name, "ray_actor_options": {"num_cpus": num_cpus},
            # the ingress caps what it sends; Serve must never queue behind it
            "max_ongoing_requests": max_inflight_per_replica + 1,
            "health_check_period_s": 2.0,
        }
        if index < num_always:
            options["num_replicas"] = 1
        else:
            options["autoscaling_config"] = {
                "min_replicas": 0, "initial_replicas": 0, "max_replicas": 1,
                "target_ongoing_requests": target_ongoing_requests,
                "upscale_delay_s": 0.0, "downscale_delay_s": scale_down_after_s,
                "downscale_to_zero_delay_s": scale_down_after_s,
                # the mean of its ongoing requests over this window falls to 0 first; Serve
                # wants it above its metrics interval (10 s)
                "look_back_period_s": 12.0,
            }
        names.append(name)
        replicas.append(EngineReplica.options(**options).bind(name, model, config, served_model_name,
                                                             app_options))
    router = {"policy": policy, "max_inflight": max_inflight_per_replica,
              "spill_after": num_always if num_always < num_total else None,
              "spill_at": target_ongoing_requests, **(router_options or {})}
    return Ingress.bind(names, router, *replicas)


def app_builder(args: dict[str, str]) -> serve.Application:
    """For ``serve run inferpath.deploy.app:app_builder model=M num_replicas=2 ...``."""
    known = {"model": str, "num_replicas": int, "policy": str, "num_cpus": float, "threads": int,
             "min_replicas": int, "max_replicas": int, "target_ongoing_requests": int,
             "max_inflight_per_replica": int, "scale_down_after_s": float}
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if "model" not in args:
        raise ValueError("give model=ALIAS_OR_PATH")
    return build_app(**{key: known[key](value) for key, value in args.items()})
