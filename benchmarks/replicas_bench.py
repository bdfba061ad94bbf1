"""Replicas on Ray Serve: 1 and 2 replicas, prefix-aware vs round-robin routing, on a
shared-prefix and a random workload.

    python benchmarks/replicas_bench.py [--threads 1] [--num-kv-blocks 64] [--max-tokens 16]

Starts a local Ray cluster on 127.0.0.1 (``--num-cpus``), deploys ``inferpath.deploy``
with 1 replica, then 2, and for each routing policy sends each workload through the
ingress with ``--concurrency`` streams in flight:

- shared-prefix: 8 system prompts x 8 questions, in random order;
- random: 64 prompts of random words (no shared prefix beyond the chat template).

Prints throughput (requests/s and generated tokens/s), TTFT p50/p99 and the replicas'
prefix-cache hit rate (their own ``prefix_cache_hits / prefix_cache_queries`` over the
run, in prompt tokens) and saves the table as JSON (default
``benchmarks/results/replicas_bench.json``). No assertions: compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

RESULTS = Path(__file__).parent / "results"
WORDS = ("river stone lamp orbit cedar pixel harbor violet engine meadow quartz lantern "
         "copper willow signal basalt ember falcon tundra saffron").split()


def workload(kind: str, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    if kind == "shared-prefix":
        systems = [f"You are assistant {seed}-{i}. " + " ".join(rng.choice(WORDS) for _ in range(150))
                   for i in range(8)]
        requests = [[{"role": "system", "content": s},
                     {"role": "user", "content": f"Question {q}: name a colour."}]
                    for s in systems for q in range(8)]
        rng.shuffle(requests)
        return requests
    return [[{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(150))}]
            for _ in range(64)]


def metric_sum(url: str, name: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=60).text):
        total += sum(s.value for s in family.samples if s.name == name)
    return total


async def one(client: httpx.AsyncClient, url: str, model: str, messages: list[dict],
              max_tokens: int) -> tuple[float, int]:
    start = time.perf_counter()
    ttft, tokens = None, 0
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line[6:])
            if "error" in payload:
                raise RuntimeError(payload["error"]["message"])
            if payload.get("usage"):
                tokens = payload["usage"]["completion_tokens"]
            elif ttft is None and any(c.get("delta", {}).get("content") for c in payload["choices"]):
                ttft = time.perf_counter() - start
    return ttft if ttft is not None else time.perf_counter() - start, tokens


async def run_workload(url: str, model: str, requests: list[list[dict]], concurrency: int,
                       max_tokens: int) -> dict:
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600)) as client:
        async def bounded(messages):
            async with semaphore:
                return await one(client, url, model, messages, max_tokens)
        start = time.perf_counter()
        results = await asyncio.gather(*(bounded(m) for m in requests))
        elapsed = time.perf_counter() - start
    ttfts = sorted(t for t, _ in results)
    return {"requests": len(results), "seconds": elapsed,
            "requests_per_s": len(results) / elapsed,
            "output_tokens_per_s": sum(n for _, n in results) / elapsed,
            "ttft_p50_ms": 1000 * statistics.median(ttfts),
            "ttft_p99_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=1, help="compute threads per replica")
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    parser.add_argument("--num-kv-blocks", type=int, default=64,
                        help="KV blocks per replica (64: about five of the shared system prompts)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--output", type=Path, default=RESULTS / "replicas_bench.json")
    args = parser.parse_args(argv)
    try:
        import ray
        from ray import serve
    except ImportError:
        print("replicas_bench: needs Ray Serve: pip install 'inferpath[distributed]'", file=sys.stderr)
        return 1
    import inferpath
    from inferpath.deploy.app import build_app
    from inferpath.models import served_model_names

    src = str(Path(inferpath.__file__).resolve().parents[1])
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", runtime_env={"env_vars": {"PYTHONPATH": src}})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    model = served_model_names(args.model)[0]
    rows, seed = [], 0
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for num_replicas, policies in ((1, ("prefix",)), (2, ("prefix", "round_robin"))):
            serve.run(build_app(args.model, num_replicas=num_replicas, threads=args.threads,
                                num_cpus=args.num_cpus / num_replicas,
                                engine_config={"num_kv_blocks": args.num_kv_blocks}),
                      name="inferpath", route_prefix="/")
            asyncio.run(run_workload(url, model, workload("random", 999)[:4], 4, 2))  # warm up
            for policy in policies:
                serve.get_app_handle("inferpath").set_policy.remote(policy).result()
                for kind in ("shared-prefix", "random"):
                    seed += 1
                    hits = metric_sum(url, "inferpath:prefix_cache_hits_total")
                    queries = metric_sum(url, "inferpath:prefix_cache_queries_total")
                    row = asyncio.run(run_workload(url, model, workload(kind, seed), args.concurrency,
                                                   args.max_tokens))
                    hits = metric_sum(url, "inferpath:prefix_cache_hits_total") - hits
                    queries = metric_sum(url, "inferpath:prefix_cache_queries_total") - queries
                    row.update(replicas=num_replicas, policy=policy if num_replicas > 1 else "-",
                               workload=kind, prefix_hit_rate=hits / queries if queries else 0.0)
                    rows.append(row)
                    print(f"{num_replicas} {row['policy']:<11} {kind:<13} {row['requests_per_s']:6.2f} req/s "
                          f"{row['output_tokens_per_s']:7.1f} tok/s  TTFT p50 {row['ttft_p50_ms']:7.0f} ms "
                          f"p99 {row['ttft_p99_ms']:7.0f} ms  hit rate {row['prefix_hit_rate']:.2f}", flush=True)
            serve.delete("inferpath")
    finally:
        serve.shutdown()
        ray.shutdown()
    header = "| replicas | routing | workload | req/s | out tok/s | TTFT p50 ms | TTFT p99 ms | prefix hit rate |"
    print("\n" + header + "\n|" + "---|" * 8)
    for r in rows:
        print(f"| {r['replicas']} | {r['policy']} | {r['workload']} | {r['requests_per_s']:.2f} | "
              f"{r['output_tokens_per_s']:.1f} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | "
              f"{r['prefix_hit_rate']:.2f} |")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()},
                                       "rows": rows}, indent=2))
    print(f"saved {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
