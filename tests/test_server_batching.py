"""Continuous batching through the HTTP server, read from the outside (``openai`` client
and /metrics):

- 16 concurrent streaming clients get the greedy outputs each prompt gets alone;
- a shared prefix: the second request computes only its unshared tokens, same output;
- a tiny KV budget forces preemption; every request completes with its output unchanged;
- a full waiting queue answers 429;
- clients that disconnect (mid-stream, or while waiting for a whole reply) are aborted
  and leave zero KV blocks in use.

Two servers share one copy of the SmolLM2 weights: ``server`` (a roomy cache) and
``tiny`` (6 blocks of 16 tokens, 4 sequences, 4 waiting at most).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from server_harness import MODEL, async_client, client, read_metrics, start_server, tokenize

PROMPTS = [f"Question {i}: what is {word}? Answer:" for i, word in enumerate(
    ("a river", "a cloud", "gravity", "a violin", "a comet", "bread", "a glacier", "an owl",
     "a bridge", "a desert", "a tide", "a clock", "honey", "a volcano", "a lighthouse", "snow"))]
NEW_TOKENS = 16  # per request, with ignore_eos: every prompt grows past its first block
TINY_BLOCKS = 6


@pytest.fixture(scope="module")
def server():
    srv = start_server(max_model_len=512, max_num_seqs=32)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tiny():
    srv = start_server(num_kv_blocks=TINY_BLOCKS, max_model_len=TINY_BLOCKS * 16,
                       max_num_seqs=4, max_waiting_requests=4)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def alone(server):
    """Each prompt's greedy output, run alone (one request in the engine at a time)."""
    oai = client(server)
    return [_greedy(oai, p, NEW_TOKENS, ignore_eos=True).choices[0].text for p in PROMPTS]


def _greedy(oai, prompt, max_tokens=10, **extra):
    return oai.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                  temperature=0, extra_body=extra or None)


async def _stream_all(srv, prompts, max_tokens, **extra) -> list[str]:
    oai = async_client(srv)

    async def one(prompt):
        stream = await oai.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                              temperature=0, stream=True, extra_body=extra or None)
        return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

    try:
        return await asyncio.gather(*(one(p) for p in prompts))
    finally:
        await oai.close()


def _wait_until_idle(srv, timeout=60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        metrics = read_metrics(srv)
        idle = (metrics["inferpath:num_requests_running"] == 0
                and metrics["inferpath:num_requests_waiting"] == 0
                and metrics["inferpath:kv_blocks_used"] == 0)
        if idle or time.monotonic() > deadline:
            return metrics
        time.sleep(0.1)


def test_16_concurrent_streams_equal_each_prompt_alone(server, alone):
    together = asyncio.run(_stream_all(server, PROMPTS, NEW_TOKENS, ignore_eos=True))
    assert together == alone
    assert len(set(alone)) > 1  # the prompts really differ


def test_shared_prefix_computes_only_unshared_tokens(server, tiny):
    oai = client(server)
    prefix = tokenize(server, prompt="You are a careful assistant who answers in one short "
                      "sentence about geography, history, and the natural sciences. " * 2)
    first = prefix + tokenize(server, prompt=" Where is Lima?")
    second = prefix + tokenize(server, prompt=" How tall is Everest?")
    _greedy(oai, first, max_tokens=4)
    before = read_metrics(server)
    reply = _greedy(oai, second, max_tokens=6)
    after = read_metrics(server)
    num_cached = reply.usage.prompt_tokens_details.cached_tokens
    assert num_cached == len(prefix) // 16 * 16 > 0  # every full block of the shared prefix
    computed = (after["inferpath:prompt_tokens_computed_total"]
                - before["inferpath:prompt_tokens_computed_total"])
    assert computed == len(second) - num_cached
    hits = after["inferpath:prefix_cache_hits_total"] - before["inferpath:prefix_cache_hits_total"]
    assert hits == num_cached
    cold = _greedy(client(tiny), second, max_tokens=6)  # a server that never saw the prefix
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert reply.choices[0].text == cold.choices[0].text


def test_tiny_kv_budget_preempts_and_keeps_outputs(tiny, alone):
    # 4 sequences of ~12 + 16 tokens need 2 blocks each, 8 in all; the tiny server has 6
    before = read_metrics(tiny)
    together = asyncio.run(_stream_all(tiny, PROMPTS[:4], NEW_TOKENS, ignore_eos=True))
    after = _wait_until_idle(tiny)
    assert after["inferpath:num_preemptions_total"] > before["inferpath:num_preemptions_total"]
    assert together == alone[:4]
    assert after["inferpath:kv_blocks_used"] == 0


def test_full_queue_is_429_and_disconnects_free_blocks(tiny):
    oai = client(tiny)
    streams, refused = [], None
    try:
        for prompt in PROMPTS[:12]:  # at most 4 running + 4 waiting fit
            try:
                streams.append(oai.completions.create(
                    model=MODEL, prompt=prompt, max_tokens=80, temperature=0, stream=True,
                    extra_body={"ignore_eos": True}))
            except openai.RateLimitError as exc:
                refused = exc
                break
    finally:
        for stream in streams:
            stream.close()
    assert refused is not None and refused.status_code == 429
    assert refused.body["code"] == "queue_full"
    assert "max_waiting_requests=4" in refused.body["message"]
    metrics = _wait_until_idle(tiny)
    assert metrics["inferpath:kv_blocks_used"] == 0
    assert metrics['inferpath:request_errors_total{status="429"}'] >= 1


def test_disconnected_streams_are_aborted_and_free_their_blocks(server):
    oai = client(server)
    before = read_metrics(server)
    streams = [oai.completions.create(model=MODEL, prompt=p, max_tokens=300, temperature=0,
                                      stream=True, extra_body={"ignore_eos": True})
               for p in PROMPTS[:3]]
    for stream in streams:
        iterator = iter(stream)
        next(iterator), next(iterator)  # two tokens arrived: the request holds blocks
    assert read_metrics(server)["inferpath:kv_blocks_used"] > 0
    for stream in streams:
        stream.close()
    with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up
        httpx.post(server.url + "/v1/completions", timeout=1.0, json={
            "model": MODEL, "prompt": PROMPTS[3], "max_tokens": 480, "ignore_eos": True})
    after = _wait_until_idle(server)
    assert after["inferpath:kv_blocks_used"] == 0
    aborted = 'inferpath:request_success_total{finished_reason="abort"}'
    assert after.get(aborted, 0) - before.get(aborted, 0) == 4
    generated = (after["inferpath:generation_tokens_total"]
                 - before["inferpath:generation_tokens_total"])
    assert generated < 3 * 300 + 480  # stopped well before max_tokens
