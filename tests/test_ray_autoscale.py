"""Autoscaling between --min-replicas 1 and --max-replicas 2 on queue depth (inflight per
replica at the ingress), on a local Ray cluster started here (2 CPUs, 127.0.0.1) with
SmolLM2 replicas of 1 thread.

One scenario, in order: the spare engine-1 starts scaled to zero; a queue on engine-0
(more requests in flight than ``target_ongoing_requests``) makes the ingress start it and
route to it; once the queue is gone, Serve scales it back to zero and the router forgets
it, while requests keep completing on engine-0 throughout; a deep queue again starts it
again. Skipped without ``ray[serve]``.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import httpx
import pytest

ray = pytest.importorskip("ray", reason="ray[serve] is not installed (pip install inferpath[distributed])")
serve = pytest.importorskip("ray.serve", reason="ray[serve] is not installed")

import inferpath  # noqa: E402

MODEL = "smollm2-135m-instruct"
ENGINE = {"batch_invariant": True, "num_kv_blocks": 64, "max_num_seqs": 4}
TARGET = 2  # requests in flight per running replica before the spare starts
APP = "inferpath-autoscale"
# longer than one 64-character routing chunk: the router notes a prefix for each replica
QUESTIONS = [f"Name one animal that lives where winters are long and cold, number {i}." for i in range(4)]


def _running(name: str) -> int:
    deployment = serve.status().applications[APP].deployments[name]
    return {getattr(k, "value", k): v for k, v in deployment.replica_states.items()}.get("RUNNING", 0)


@pytest.fixture(scope="module")
def cluster():
    from inferpath.deploy.app import build_app

    src = str(Path(inferpath.__file__).resolve().parents[1])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"PYTHONPATH": src}})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(MODEL, min_replicas=1, max_replicas=2, engine_config=ENGINE, num_cpus=0.5,
                            threads=1, target_ongoing_requests=TARGET, max_inflight_per_replica=4,
                            scale_down_after_s=3.0),
                  name=APP, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


async def _ask(client: httpx.AsyncClient, url: str, question: str, max_tokens: int) -> dict:
    response = await client.post(url + "/v1/chat/completions", json={
        "model": MODEL, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": "user", "content": question}]})
    body = response.json()
    return {"status": response.status_code, "question": question, "body": body,
            "replica": response.headers.get("x-inferpath-replica"),
            "route": response.headers.get("x-inferpath-route")}


def _replicas(url: str) -> dict[str, dict]:
    return {r["replica"]: r for r in httpx.get(url + "/health", timeout=60).json()["replicas"]}


def test_a_spare_starts_on_a_deep_queue_and_is_scaled_down_when_idle(cluster):
    health = _replicas(cluster)
    assert health["engine-0"]["status"] == "ok"
    assert health["engine-1"]["status"] == "scaled_to_zero" and _running("engine-1") == 0

    results = asyncio.run(_burst(cluster))
    _check_burst(results)
    assert _events(cluster) == [("engine-1", "waking"), ("engine-1", "started")]
    health = _replicas(cluster)
    assert _running("engine-1") == 1 and health["engine-1"]["status"] == "ok"
    assert health["engine-1"]["num_prefix_chunks_routed"] > 0

    async def trickle() -> list[dict]:
        """One request at a time (never deep) until engine-1 is scaled to zero (bounded)."""
        done: list[dict] = []
        async with httpx.AsyncClient(timeout=httpx.Timeout(300)) as client:
            deadline = time.monotonic() + 180
            while True:
                done.append(await _ask(client, cluster, QUESTIONS[len(done) % 4], max_tokens=2))
                if await asyncio.to_thread(_running, "engine-1") == 0:
                    health = await asyncio.to_thread(_replicas, cluster)
                    if health["engine-1"]["status"] == "scaled_to_zero":
                        return done
                assert time.monotonic() < deadline, "engine-1 was not scaled down"
                await asyncio.sleep(0.5)

    during = asyncio.run(trickle())
    assert all(r["status"] == 200 for r in during), [r for r in during if r["status"] != 200][:3]
    assert {r["replica"] for r in during} == {"engine-0"}  # a shallow queue never needs the spare
    health = _replicas(cluster)
    assert health["engine-1"]["num_prefix_chunks_routed"] == 0  # forgotten with its cache
    assert _events(cluster)[-1] == ("engine-1", "stopped")
    metrics = httpx.get(cluster + "/metrics", timeout=60).text
    assert 'inferpath:router_replica_up{replica="engine-1"} 0' in metrics

    # a deep queue again: the forgotten spare is started and learned again
    again = asyncio.run(_burst(cluster))
    _check_burst(again)
    assert _events(cluster)[-2:] == [("engine-1", "waking"), ("engine-1", "started")]


async def _burst(url: str) -> list[dict]:
    """Keep 6 requests in flight (3x the target on one replica) until engine-1 has served
    4 of them (bounded), then let them finish."""
    results: list[dict] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(300)) as client:
        async def worker(k: int) -> None:
            deadline = time.monotonic() + 240
            i = k
            while sum(r["replica"] == "engine-1" for r in results) < 4:
                assert time.monotonic() < deadline, f"engine-1 never served: {results[-3:]}"
                results.append(await _ask(client, url, QUESTIONS[i % 4], max_tokens=16))
                i += 6
        await asyncio.wait_for(asyncio.gather(*(worker(k) for k in range(6))), timeout=300)
    return results


def _check_burst(results: list[dict]) -> None:
    assert all(r["status"] == 200 and r["body"]["choices"][0]["finish_reason"] == "length"
               for r in results), [r for r in results if r["status"] != 200][:3]
    assert {r["replica"] for r in results} == {"engine-0", "engine-1"}
    # greedy and batch-invariant: a question gets one answer, whichever replica served it
    answers: dict[str, set[str]] = {}
    for r in results:
        answers.setdefault(r["question"], set()).add(r["body"]["choices"][0]["message"]["content"])
    assert all(len(texts) == 1 for texts in answers.values()), answers


def _events(url: str) -> list[tuple[str, str]]:
    """The spares' events at the ingress: (replica, waking | started | stopped | failed)."""
    return [(e["replica"], e["event"])
            for e in httpx.get(url + "/v1/router", timeout=60).json()["spares"]["events"]]
