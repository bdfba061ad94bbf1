"""Replicas on Ray Serve (inferpath.deploy): a local Ray cluster started here (2 CPUs,
bound to 127.0.0.1), two SmolLM2 replicas of 1 thread each behind the ingress, driven by
the official ``openai`` client and plain SSE reads.

One cluster and one application serve the whole file (starting them costs most of its
time); the test that kills a replica runs last. Skipped when ``ray[serve]`` is not
installed (the ``distributed`` extra; CI installs it with ``[test]``).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

ray = pytest.importorskip("ray", reason="ray[serve] is not installed (pip install inferpath[distributed])")
serve = pytest.importorskip("ray.serve", reason="ray[serve] is not installed")

import inferpath  # noqa: E402
from inferpath.config import EngineConfig  # noqa: E402
from inferpath.engine import AsyncEngine, LLMEngine  # noqa: E402
from inferpath.models import served_model_names  # noqa: E402
from inferpath.server.app import build_app as build_server_app  # noqa: E402
from inferpath.server.launch import ServerThread  # noqa: E402

MODEL = "smollm2-135m-instruct"
# batch-invariant: a greedy answer is the same whatever shares its steps, so the replicas'
# answers can be compared with one engine's token for token; 40 blocks of 16 tokens hold
# about five of the 100-token system prompts below (the hit-rate test relies on it)
ENGINE = {"batch_invariant": True, "num_kv_blocks": 40, "max_num_seqs": 8}
MAX_INFLIGHT = 4  # per replica, at the ingress: the rest wait there, not yet started
APP = "inferpath"
KEY = "replica-key"  # --api-key reaches every replica's app (the ingress forwards the header)
AUTH = {"Authorization": f"Bearer {KEY}"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    from inferpath.deploy.app import build_app

    src = str(Path(inferpath.__file__).resolve().parents[1])  # this tree, in every worker
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", runtime_env={"env_vars": {"PYTHONPATH": src}})
    port = _free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(MODEL, num_replicas=2, engine_config=ENGINE, num_cpus=0.5, threads=1,
                        max_inflight_per_replica=MAX_INFLIGHT, app_options={"api_key": KEY})
        serve.run(app, name=APP, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)


def _replica_metrics(url: str, name: str) -> dict[str, float]:
    """Sum of ``name`` over the model, by replica, from the ingress's /metrics."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=60).text):
        for sample in family.samples:
            if sample.name == name:
                values[sample.labels["replica"]] = values.get(sample.labels["replica"], 0) + sample.value
    return values


QUESTIONS = [f"In one word: what colour is item number {i}?" for i in range(16)]


def test_64_requests_complete_on_both_replicas_and_equal_one_engine(cluster):
    async def ask(client, question):
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=6,
            temperature=0)
        return raw.headers["x-inferpath-replica"], raw.headers["x-inferpath-route"], raw.parse()

    async def run_all():
        client = _client(cluster)
        semaphore = asyncio.Semaphore(16)

        async def bounded(question):
            async with semaphore:
                return await ask(client, question)
        return await asyncio.gather(*(bounded(q) for q in QUESTIONS * 4))

    results = asyncio.run(run_all())
    assert len(results) == 64 and all(r[2].choices[0].finish_reason in ("stop", "length") for r in results)
    served = {replica for replica, _, _ in results}
    assert served == {"engine-0", "engine-1"}, served
    assert all(route.split(";")[0] in ("prefix", "load") for _, route, _ in results)

    engine = LLMEngine.from_model(MODEL, EngineConfig(**ENGINE, threads=1))
    with ServerThread(build_server_app(AsyncEngine(engine), served_model_name=served_model_names(MODEL))) as single:
        reference = openai.OpenAI(base_url=single.url + "/v1", api_key=KEY, max_retries=0)
        expected = {q: reference.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": q}], max_tokens=6,
            temperature=0).choices[0].message.content for q in QUESTIONS}
    for question, (_, _, completion) in zip(QUESTIONS * 4, results):
        assert completion.choices[0].message.content == expected[question], question


def test_other_routes_and_streams_pass_through(cluster):
    sync = openai.OpenAI(base_url=cluster + "/v1", api_key=KEY, max_retries=0, timeout=300)
    text = sync.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4,
                                   temperature=0).choices[0].text
    streamed = "".join(chunk.choices[0].text for chunk in sync.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, stream=True)
        if chunk.choices)
    assert streamed == text and text
    response = sync.responses.create(model=MODEL, input="Say hi", max_output_tokens=4, temperature=0)
    assert response.output_text
    assert sync.responses.retrieve(response.id).output_text == response.output_text  # its replica's store
    for _ in range(3):  # a continuation goes to the replica whose store holds its previous response
        raw = sync.responses.with_raw_response.create(model=MODEL, input="And again",
                                                      previous_response_id=response.id,
                                                      max_output_tokens=4, temperature=0)
        assert raw.headers["x-inferpath-route"].startswith("owner"), raw.headers["x-inferpath-route"]
        assert raw.parse().output_text
    # the glass box across replicas: the trace says which replica served it and why
    raw = sync.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=3, temperature=0,
        extra_headers={"X-Inferpath-Trace": "1"})
    trace = httpx.get(f"{cluster}/v1/trace/{raw.parse().id}", timeout=120, headers=AUTH).json()
    assert trace["routing"]["replica"] == raw.headers["x-inferpath-replica"]
    assert trace["routing"]["reason"] == raw.headers["x-inferpath-route"].split(";")[0]
    assert trace["steps"], trace.keys()
    assert httpx.post(cluster + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).status_code == 401
    messages = httpx.post(cluster + "/v1/messages", timeout=300, headers={"x-api-key": KEY}, json={
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi"}]})
    assert messages.status_code == 200 and messages.json()["type"] == "message"
    health = httpx.get(cluster + "/health", timeout=60).json()
    assert health["status"] == "ok" and [r["replica"] for r in health["replicas"]] == ["engine-0", "engine-1"]
    assert all(r["status"] == "ok" and r["num_kv_blocks_total"] == 40 for r in health["replicas"])
    finished = _replica_metrics(cluster, "inferpath:generation_tokens_total")
    assert set(finished) == {"engine-0", "engine-1"} and all(v > 0 for v in finished.values())


def _system_prompts(seed: int) -> list[str]:
    rng = random.Random(seed)
    words = "river stone lamp orbit cedar pixel harbor violet engine meadow quartz lantern".split()
    return [f"You are assistant {seed}-{i}. " + " ".join(rng.choice(words) for _ in range(80))
            for i in range(8)]


def _hit_rate_of(cluster: str, policy: str, systems: list[str]) -> tuple[float, list[str]]:
    """Send 8 systems x 8 questions one at a time; the replicas' own prefix-cache hit rate
    (hits / lookups, in prompt tokens) over these 64 requests, and the routing reasons.

    The order rotates the system prompts by one each round, so a load-blind policy gives
    each replica all eight in turn (more than its cache holds: each is evicted before it
    comes back), while the prefix router keeps each on one replica (four each, which fit).
    """
    handle = serve.get_app_handle(APP)
    handle.set_policy.remote(policy).result()
    before = (_replica_metrics(cluster, "inferpath:prefix_cache_hits_total"),
              _replica_metrics(cluster, "inferpath:prefix_cache_queries_total"))
    sync = openai.OpenAI(base_url=cluster + "/v1", api_key=KEY, max_retries=0, timeout=300)
    reasons = []
    for round_index in range(8):
        for k in range(8):
            system = systems[(k + round_index) % 8]
            raw = sync.chat.completions.with_raw_response.create(
                model=MODEL, max_tokens=1, temperature=0,
                messages=[{"role": "system", "content": system},
                          {"role": "user", "content": f"Question {round_index}: name a colour."}])
            reasons.append(raw.headers["x-inferpath-route"].split(";")[0])
    after = (_replica_metrics(cluster, "inferpath:prefix_cache_hits_total"),
             _replica_metrics(cluster, "inferpath:prefix_cache_queries_total"))
    hits = sum(after[0].values()) - sum(before[0].values())
    queries = sum(after[1].values()) - sum(before[1].values())
    return hits / queries, reasons


def test_prefix_router_hits_at_least_twice_round_robin(cluster):
    prefix_rate, prefix_reasons = _hit_rate_of(cluster, "prefix", _system_prompts(1))
    rr_rate, rr_reasons = _hit_rate_of(cluster, "round_robin", _system_prompts(2))
    serve.get_app_handle(APP).set_policy.remote("prefix").result()
    assert set(rr_reasons) == {"round_robin"}
    assert prefix_reasons.count("prefix") >= 56, prefix_reasons  # all but the first of each system
    assert prefix_rate > 0.5, prefix_rate
    assert prefix_rate >= 2 * rr_rate, (prefix_rate, rr_rate)


async def _stream(url: str, index: int, streaming_on: dict[str, asyncio.Event]) -> dict:
    """One streaming chat request read as raw SSE: its replica, how it ended, when;
    ``streaming_on[replica]`` is set once it has received a few tokens from there."""
    start = time.monotonic()
    result = {"index": index, "replica": None, "events": 0, "done": False, "error": None,
              "finish_reason": None}
    async with httpx.AsyncClient(timeout=httpx.Timeout(180)) as client:
        async with client.stream("POST", url + "/v1/chat/completions", headers=AUTH, json={
                "model": MODEL, "stream": True, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Count slowly to {index + 40}."}]}) as response:
            result["status"] = response.status_code
            result["replica"] = response.headers.get("x-inferpath-replica")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    result["done"] = True
                    break
                payload = json.loads(data)
                if "error" in payload:
                    result["error"] = payload["error"]["message"]
                else:
                    result["events"] += 1
                    if result["events"] == 4 and result["replica"] in streaming_on:
                        streaming_on[result["replica"]].set()
                    for choice in payload.get("choices", []):
                        result["finish_reason"] = choice.get("finish_reason") or result["finish_reason"]
    result["seconds"] = time.monotonic() - start
    return result


async def _ask(client: httpx.AsyncClient, url: str, question: str, stream: bool) -> dict:
    """One chat request of 8 greedy tokens, streamed (raw SSE) or not: its replica, route,
    text, finish reason and any error."""
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": stream,
            "messages": [{"role": "user", "content": question}]}
    result = {"question": question, "text": "", "finish_reason": None, "error": None}
    async with client.stream("POST", url + "/v1/chat/completions", headers=AUTH, json=body) as response:
        result.update(status=response.status_code, replica=response.headers.get("x-inferpath-replica"),
                      route=response.headers.get("x-inferpath-route"))
        if not stream:
            payload = json.loads(await response.aread())
            if "error" in payload:
                result["error"] = payload["error"]["message"]
            else:
                result["text"] = payload["choices"][0]["message"]["content"]
                result["finish_reason"] = payload["choices"][0]["finish_reason"]
            return result
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line[len("data: "):])
            if "error" in payload:
                result["error"] = payload["error"]["message"]
            for choice in payload.get("choices", []):
                result["text"] += choice["delta"].get("content") or ""
                result["finish_reason"] = choice.get("finish_reason") or result["finish_reason"]
    return result


def _wait_until_back(url: str, index: int, old_pid: int) -> None:
    """Until /health reports replica ``index`` up again in a new process (Serve restarted it)."""
    deadline = time.monotonic() + 240
    while True:
        health = httpx.get(url + "/health", timeout=60).json()
        replica = health["replicas"][index]
        if replica["status"] == "ok" and replica.get("pid") not in (None, old_pid):
            return
        assert time.monotonic() < deadline, f"engine-{index} did not come back: {health}"
        time.sleep(1)


def test_requests_inside_a_replica_killed_before_their_first_byte_are_retried(cluster):
    """engine-1 holds the requests it gets (a test hook: they wait before its app, so no
    byte of theirs is sent) and is killed with them inside: each is retried on engine-0
    and completes with the answer it gets there anyway; Serve restarts engine-1."""
    replica = serve.get_deployment_handle("engine-1", app_name=APP)
    actor_name = replica.actor_name.remote().result()
    old_pid = replica.stats.remote().result()["pid"]
    retries_before = _router_retries(cluster)
    questions = [f"Name a fruit, number {i}." for i in range(8)]

    replica.hold.remote(True).result()

    async def scenario():
        async with httpx.AsyncClient(timeout=httpx.Timeout(180)) as client:
            # streamed and not in pairs: the router alternates, so engine-1 gets both kinds
            tasks = [asyncio.create_task(_ask(client, cluster, q, stream=i // 2 % 2 == 0))
                     for i, q in enumerate(questions)]
            deadline = time.monotonic() + 120
            while (await replica.stats.remote())["num_held"] < 2:  # some of each kind are inside
                assert time.monotonic() < deadline, "engine-1 never got a request"
                await asyncio.sleep(0.2)
            await asyncio.sleep(0.5)  # the rest the router sends there arrive too
            num_held = (await replica.stats.remote())["num_held"]
            ray.kill(ray.get_actor(actor_name, namespace="serve"), no_restart=True)
            return num_held, await asyncio.wait_for(asyncio.gather(*tasks), timeout=240)  # none hangs

    num_held, results = asyncio.run(scenario())
    assert all(r["status"] == 200 and r["error"] is None for r in results), results
    assert all(r["replica"] == "engine-0" for r in results), results  # engine-1 answered none
    retried = [r for r in results if "retried_from=engine-1" in r["route"]]
    assert len(retried) == num_held >= 2, (num_held, results)
    assert all(r["finish_reason"] == "length" and r["text"] for r in results), results
    assert _router_retries(cluster) - retries_before == num_held

    _wait_until_back(cluster, 1, old_pid)  # a new engine-1, its doors open

    async def again():  # the same questions on the healthy pair: the same greedy answers
        async with httpx.AsyncClient(timeout=httpx.Timeout(180)) as client:
            return await asyncio.gather(*(_ask(client, cluster, q, stream=False) for q in questions))
    answers = asyncio.run(again())
    assert [a["text"] for a in answers] == [r["text"] for r in results]
    assert "engine-1" in {a["replica"] for a in answers}


def _router_retries(url: str) -> float:
    families = text_string_to_metric_families(httpx.get(url + "/metrics", timeout=60).text)
    return sum(s.value for f in families for s in f.samples if s.name == "inferpath:router_retries_total")


def test_killed_replica_ends_its_streams_with_an_error_and_comes_back(cluster):
    replica = serve.get_deployment_handle("engine-0", app_name=APP)
    actor_name = replica.actor_name.remote().result()
    old_pid = replica.stats.remote().result()["pid"]

    async def scenario():
        streaming_on = {"engine-0": asyncio.Event()}
        tasks = [asyncio.create_task(_stream(cluster, i, streaming_on)) for i in range(16)]
        # kill once engine-0 is mid-stream: a client has received tokens from it
        await asyncio.wait_for(streaming_on["engine-0"].wait(), timeout=120)
        ray.kill(ray.get_actor(actor_name, namespace="serve"), no_restart=True)
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout=240)  # none hangs

    results = asyncio.run(scenario())
    assert all(r["status"] == 200 for r in results), results
    errored = [r for r in results if r["error"]]
    completed = [r for r in results if not r["error"]]
    assert all(r["done"] for r in results), "every stream ends with [DONE] after its last event"
    assert errored and all(r["replica"] == "engine-0" for r in errored), results
    assert all("engine-0 failed mid-stream" in r["error"] for r in errored)
    assert len(errored) <= MAX_INFLIGHT  # only the ones that had started there
    assert all(r["finish_reason"] == "length" for r in completed), completed  # all 64 tokens
    # the requests that had not started when it died completed on the other replica
    assert any(r["replica"] == "engine-1" for r in completed)

    _wait_until_back(cluster, 0, old_pid)  # Serve restarts it; the ingress routes to it again
    sync = openai.OpenAI(base_url=cluster + "/v1", api_key=KEY, max_retries=0, timeout=300)
    served = {sync.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": f"Hello {i}"}], max_tokens=2,
        temperature=0).headers["x-inferpath-replica"] for i in range(6)}
    assert "engine-0" in served


def test_app_arguments_are_checked_before_anything_starts():
    """No cluster needed: building the application validates its arguments."""
    from inferpath.deploy.app import app_builder, build_app

    assert isinstance(app_builder({"model": MODEL, "num_replicas": "2", "threads": "1"}),
                      serve.Application)
    with pytest.raises(ValueError, match=r"min_replicas \(3\) <= max_replicas \(2\)"):
        build_app(MODEL, min_replicas=3, max_replicas=2)
    with pytest.raises(ValueError, match="both --min-replicas and --max-replicas"):
        build_app(MODEL, min_replicas=1)
    with pytest.raises(ValueError, match=r"target_ongoing_requests \(40\) must be between 1 and "
                                         r"max_inflight_per_replica \(32\)"):
        build_app(MODEL, min_replicas=1, max_replicas=2, target_ongoing_requests=40)
    with pytest.raises(ValueError, match="unknown argument.*replicas"):
        app_builder({"model": MODEL, "replicas": "2"})
