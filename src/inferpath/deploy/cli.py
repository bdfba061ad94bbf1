"""``inferpath serve MODEL --replicas N``: the flags, and serving them on Ray Serve.

The flags import nothing of Ray; ``run_replicas`` does, and says how to install it when it
is missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time


def add_replica_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("replicas on Ray Serve (pip install 'inferpath[distributed]')")
    group.add_argument("--replicas", type=int, default=None, metavar="N",
                       help="serve N engine replicas on Ray Serve behind one ingress (default: "
                            "one engine in this process)")
    group.add_argument("--min-replicas", type=int, default=None, metavar="N",
                       help="autoscale between --min-replicas and --max-replicas on queue depth")
    group.add_argument("--max-replicas", type=int, default=None, metavar="N")
    group.add_argument("--ray-address", default=None, metavar="ADDR",
                       help="join this Ray cluster (default: start a local one)")
    group.add_argument("--routing", choices=("prefix", "round_robin"), default="prefix",
                       help="replica choice: prefix affinity balanced against load, or "
                            "round-robin (default: prefix)")
    group.add_argument("--replica-cpus", type=float, default=1.0, metavar="N",
                       help="Ray CPUs each replica reserves (default: 1); its compute threads "
                            "are --threads (default 1 with replicas)")
    group.add_argument("--target-queue-depth", type=int, default=8, metavar="N",
                       help="with --min/--max-replicas: requests in flight per replica before "
                            "a spare one starts (default: 8)")
    group.add_argument("--scale-down-after", type=float, default=60.0, metavar="S",
                       help="with --min/--max-replicas: Serve stops a spare replica idle this "
                            "many seconds (default: 60)")


def wants_replicas(args: argparse.Namespace) -> bool:
    return args.replicas is not None or args.min_replicas is not None or args.max_replicas is not None


def run_replicas(args: argparse.Namespace, model: str, engine_config) -> int:
    """Start (or join) Ray, deploy the replicas and the ingress on ``--host:--port``, serve
    until Ctrl-C."""
    try:
        import ray
        from ray import serve
    except ImportError:
        print("inferpath serve: --replicas needs Ray Serve: pip install 'inferpath[distributed]'",
              file=sys.stderr)
        return 1
    from inferpath.cli.serve import response_store_from_args, tracing_allowed
    from inferpath.deploy.app import build_app

    config = {field.name: getattr(engine_config, field.name) for field in dataclasses.fields(engine_config)}
    threads = config.pop("threads") or 1  # declared per replica, never the host's cores
    try:
        app = build_app(model, num_replicas=args.replicas, engine_config=config, policy=args.routing,
                        num_cpus=args.replica_cpus, threads=threads, min_replicas=args.min_replicas,
                        max_replicas=args.max_replicas, target_ongoing_requests=args.target_queue_depth,
                        scale_down_after_s=args.scale_down_after,
                        served_model_name=args.served_model_name,
                        app_options={"api_key": args.api_key, "max_n": args.max_n,
                                     "allowed_origins": args.allowed_origins,
                                     "reasoning_parser": args.reasoning_parser,
                                     "sampling_defaults": getattr(args, "sampling_defaults", None),
                                     "response_store": response_store_from_args(args),
                                     "tracing": tracing_allowed(args.trace, args.host)})
    except ValueError as exc:
        print(f"inferpath serve: {exc}", file=sys.stderr)
        return 1
    ray.init(address=args.ray_address)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(app, name="inferpath", route_prefix="/")
    print(f"inferpath serve: replicas of {model} on http://{args.host}:{args.port}/v1 "
          f"(routing: {args.routing}; /health and /metrics per replica)", file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
    return 0
