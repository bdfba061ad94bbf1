"""Soak: a real ``inferpath serve`` under 16 concurrent streaming clients for 60 s, with
random disconnects (issue 13). Sized for 2 cores.

Every stream that is read to its end must end with a finish reason and ``[DONE]``, no
request may fail, no KV block may be left held (/metrics), and the server's resident
memory must stay flat after warm-up. The figures are printed (``pytest -s``) for the
record: requests, disconnects, failures, p50/p99 TTFT and end-to-end, blocks after.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

NUM_CLIENTS = 16
DURATION_SECONDS = 60.0
WARM_UP_SECONDS = 15.0
DISCONNECT_PROBABILITY = 0.25
#: Resident memory may grow this much after warm-up (allocator noise), not more.
MAX_RSS_GROWTH_BYTES = 96 * 2**20
PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "1, 2, 3, 4,",
           "Explain what a KV cache is in one sentence.", "Once upon a time",
           "List three primary colors:", "def fibonacci(n):", "Translate 'good morning' to French:"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"/metrics has no {name}")


@pytest.fixture(scope="module")
def serve():
    """``inferpath serve`` as a child process on a free port; yields (url, pid)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    process = subprocess.Popen(
        [sys.executable, "-m", "inferpath", "serve", "smollm2-135m-instruct", "--port", str(port),
         "--max-model-len", "512", "--max-num-seqs", "16", "--kv-cache-memory", "0.25",
         "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        if process.poll() is not None:
            raise AssertionError(f"inferpath serve exited: {process.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "inferpath serve did not start in 180 s"
        time.sleep(0.5)
    model_id = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    yield url, process.pid, model_id
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def one_request(http: httpx.AsyncClient, model_id: str, rng: random.Random,
                      stats: dict) -> None:
    body = {"model": model_id, "prompt": rng.choice(PROMPTS),
            "max_tokens": rng.randint(8, 32), "temperature": rng.choice([0, 0.8]),
            "stream": True, "seed": rng.randrange(1000)}
    disconnect_after = rng.randint(1, 6) if rng.random() < DISCONNECT_PROBABILITY else None
    start = time.perf_counter()
    first = None
    finish_reasons, done, num_events = set(), False, 0
    try:
        async with http.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                stats["failures"].append(f"status {response.status_code}: {await response.aread()!r}")
                return
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                    continue
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    stats["failures"].append(f"error event: {event}")
                    return
                num_events += 1
                if first is None:
                    first = time.perf_counter()
                finish_reasons |= {c["finish_reason"] for c in event["choices"] if c["finish_reason"]}
                if disconnect_after is not None and num_events >= disconnect_after:
                    stats["disconnects"] += 1
                    return  # leaving the block closes the connection mid-stream
    except httpx.HTTPError as exc:
        stats["failures"].append(f"{type(exc).__name__}: {exc}")
        return
    if not done or not finish_reasons:
        stats["failures"].append(f"stream ended without [DONE] or finish reason ({num_events} events)")
        return
    stats["ttft"].append(first - start)
    stats["e2e"].append(time.perf_counter() - start)


async def client_loop(url: str, model_id: str, seed: int, deadline: float, stats: dict) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        while time.monotonic() < deadline:
            await one_request(http, model_id, rng, stats)
            stats["requests"] += 1


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_soak_16_streaming_clients_with_disconnects(serve):
    url, pid, model_id = serve
    stats = {"requests": 0, "disconnects": 0, "failures": [], "ttft": [], "e2e": []}
    start = time.monotonic()
    deadline = start + DURATION_SECONDS
    rss = {}

    async def main():
        async def sample_rss():
            await asyncio.sleep(WARM_UP_SECONDS)
            rss["warm"] = rss_bytes(pid)

        await asyncio.gather(sample_rss(), *(client_loop(url, model_id, i, deadline, stats)
                                             for i in range(NUM_CLIENTS)))

    asyncio.run(main())
    elapsed = time.monotonic() - start
    for _ in range(100):  # aborts of the last disconnects land at the next engine step
        text = httpx.get(url + "/metrics", timeout=30).text
        if metric(text, "inferpath:num_requests_running") == 0 and metric(text, "inferpath:num_requests_waiting") == 0:
            break
        time.sleep(0.1)
    blocks_after = metric(text, "inferpath:kv_blocks_used")
    rss["end"] = rss_bytes(pid)
    figures = {
        "clients": NUM_CLIENTS, "seconds": round(elapsed, 1), "requests": stats["requests"],
        "disconnects": stats["disconnects"], "failures": len(stats["failures"]),
        "completed": len(stats["e2e"]),
        "ttft_p50_s": round(percentile(stats["ttft"], 0.5), 3),
        "ttft_p99_s": round(percentile(stats["ttft"], 0.99), 3),
        "e2e_p50_s": round(percentile(stats["e2e"], 0.5), 3),
        "e2e_p99_s": round(percentile(stats["e2e"], 0.99), 3),
        "kv_blocks_used_after": blocks_after,
        "rss_warm_mib": round(rss["warm"] / 2**20, 1), "rss_end_mib": round(rss["end"] / 2**20, 1),
    }
    print("\nsoak:", json.dumps(figures))
    assert stats["failures"] == [], (len(stats["failures"]), stats["failures"][:3])
    assert stats["disconnects"] > 0 and len(stats["e2e"]) > NUM_CLIENTS
    assert blocks_after == 0
    assert rss["end"] - rss["warm"] < MAX_RSS_GROWTH_BYTES, figures
    assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
