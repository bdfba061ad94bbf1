"""Serving benchmark client: statistics on hand-made timings, and SSE parsing end to end."""

from __future__ import annotations

import asyncio
import itertools
import json

import httpx
import numpy as np
import pytest

from inferpath.bench.serving import (
    BenchmarkConfig,
    build_request,
    chunk_text,
    make_prompts,
    parse_sse_line,
    run_benchmark,
    send_request,
)
from inferpath.bench.serving_metrics import RequestResult, format_summary, percentile, summarize


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0], list(np.random.default_rng(0).random(37))])
@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match="q must be in"):
        percentile([1.0], 101)


def test_tpot_is_time_after_the_first_token_per_remaining_token():
    result = RequestResult(True, output_tokens=5, ttft=0.2, itl=[0.1, 0.1, 0.1, 0.1], e2e=0.6)
    assert result.tpot == pytest.approx((0.6 - 0.2) / 4)
    assert RequestResult(True, output_tokens=1, ttft=0.2, e2e=0.2).tpot is None


def test_summarize_hand_made_run():
    results = [
        RequestResult(True, output_tokens=3, ttft=0.1, itl=[0.05, 0.05], e2e=0.2, prompt_tokens=10),
        RequestResult(True, output_tokens=5, ttft=0.3, itl=[0.1, 0.1, 0.1, 0.1], e2e=0.7, prompt_tokens=12),
        RequestResult(False, e2e=0.01, error="HTTP 500: boom"),
    ]
    summary = summarize(results, duration_s=2.0)
    assert (summary.num_requests, summary.num_completed, summary.num_failed) == (3, 2, 1)
    assert summary.total_prompt_tokens == 22 and summary.total_output_tokens == 8
    assert summary.request_throughput == pytest.approx(1.0)
    assert summary.output_throughput == pytest.approx(4.0)
    assert summary.ttft.mean_ms == pytest.approx(200.0) and summary.ttft.median_ms == pytest.approx(200.0)
    # TPOTs: 0.1/2 = 50 ms and 0.4/4 = 100 ms.
    assert summary.tpot.mean_ms == pytest.approx(75.0)
    assert summary.tpot.p90_ms == pytest.approx(95.0)
    itl = [50.0, 50.0, 100.0, 100.0, 100.0, 100.0]
    assert summary.itl.median_ms == pytest.approx(100.0)
    assert summary.itl.mean_ms == pytest.approx(sum(itl) / len(itl))
    assert summary.e2e.p99_ms == pytest.approx(200.0 + 0.99 * 500.0)
    assert summary.errors == ["HTTP 500: boom"]
    table = format_summary(summary)
    assert "TTFT" in table and "TPOT" in table and "output tok/s      4.00" in table
    json.dumps(summary.to_dict())  # serialisable
    with pytest.raises(ValueError, match="duration_s"):
        summarize(results, 0.0)


def test_unknown_prompt_tokens_and_no_successes():
    summary = summarize([RequestResult(True, output_tokens=1, ttft=0.1, e2e=0.1)], 1.0)
    assert summary.total_prompt_tokens is None and summary.tpot.median_ms is None
    empty = summarize([RequestResult(False, error="x")], 1.0)
    assert empty.num_completed == 0 and empty.ttft.mean_ms is None and empty.total_output_tokens == 0


def test_sse_parsing_for_both_endpoints():
    assert parse_sse_line("data: [DONE]") is None
    assert parse_sse_line(": keep-alive") is None
    assert parse_sse_line("") is None
    chunk = parse_sse_line('data: {"choices": [{"index": 0, "text": "Hi"}]}')
    assert chunk_text(chunk) == "Hi"
    chat = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": " there"}}]}
    assert chunk_text(chat) == " there"
    assert chunk_text({"choices": [], "usage": {"completion_tokens": 3}}) == ""
    url, body = build_request(BenchmarkConfig("http://h:1/v1/", "m", endpoint="chat", ignore_eos=True), "p")
    assert url == "http://h:1/v1/chat/completions" and body["messages"][0]["content"] == "p"
    assert body["stream"] and body["ignore_eos"] and body["stream_options"] == {"include_usage": True}


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="concurrency must be >= 1, got 0"):
        BenchmarkConfig("http://x/v1", "m", concurrency=0)
    with pytest.raises(ValueError, match="endpoint"):
        BenchmarkConfig("http://x/v1", "m", endpoint="embeddings")


def fake_server(pieces: list[str], send_usage: bool, status: int = 200) -> httpx.MockTransport:
    """An OpenAI-style SSE stream of ``pieces`` (test double for the transport only)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["stream"] is True

        async def stream():
            for piece in pieces:
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': piece}]})}\n\n".encode()
            if send_usage:
                usage = {"prompt_tokens": 7, "completion_tokens": 2 * len(pieces)}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        if status != 200:
            return httpx.Response(status, json={"error": {"message": "bad model"}})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())

    return httpx.MockTransport(handler)


def test_send_request_times_each_text_chunk_with_a_given_clock():
    clock = iter(itertools.count(start=0.0, step=0.5)).__next__  # start 0, chunks 0.5, 1.0, 1.5, ...

    async def go(send_usage):
        async with httpx.AsyncClient(transport=fake_server(["a", "b", "c"], send_usage)) as client:
            return await send_request(client, "http://x/v1/completions", {"stream": True}, clock=clock)

    with_usage = asyncio.run(go(True))
    assert with_usage.success and with_usage.text == "abc"
    assert with_usage.ttft == 0.5 and with_usage.itl == [0.5, 0.5]
    assert with_usage.e2e == 2.5  # usage chunk at 2.0, end at 2.5
    assert (with_usage.output_tokens, with_usage.prompt_tokens) == (6, 7)
    without = asyncio.run(go(False))
    assert without.output_tokens == 3 and without.prompt_tokens is None


def test_run_benchmark_counts_requests_and_failures():
    config = BenchmarkConfig("http://x/v1", "m", num_prompts=6, concurrency=2, max_tokens=4, num_warmup=1)

    async def go(transport):
        async with httpx.AsyncClient(transport=transport) as client:
            return await run_benchmark(config, client)

    summary, results = asyncio.run(go(fake_server(["x", "y"], send_usage=True)))
    assert summary.num_completed == 6 and summary.total_output_tokens == 24 and len(results) == 6
    with pytest.raises(RuntimeError, match="warm-up request to http://x/v1 failed: HTTP 404"):
        asyncio.run(go(fake_server([], send_usage=False, status=404)))


def test_prompts_are_distinct_and_reproducible():
    prompts = make_prompts(5, 12, seed=3)
    assert len(set(prompts)) == 5 and prompts == make_prompts(5, 12, seed=3)
    assert all(len(p.split()) == 13 for p in prompts)  # index + 12 words
