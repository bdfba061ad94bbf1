"""Serving benchmark client for any OpenAI-compatible server (inferpath, vLLM, llama.cpp...).

Sends ``num_prompts`` streamed requests to ``/v1/completions`` (or ``/v1/chat/completions``)
with at most ``concurrency`` in flight, optionally paced by a Poisson arrival rate, and
times every text-carrying SSE chunk of each one (see ``serving_metrics`` for the
definitions of TTFT, TPOT, ITL and E2E).

Output token counts come from the server's ``usage`` (requested with
``stream_options.include_usage``); a server that sends none is counted one token per
text-carrying chunk, which undercounts when it packs several tokens in a chunk.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from inferpath.bench.serving_metrics import RequestResult, ServingSummary, summarize

WORDS = ["the", "river", "carried", "light", "across", "a", "quiet", "valley", "where", "old", "bridges", "stood", "between", "stone", "houses", "and", "orchards", "while", "travellers", "spoke", "of", "mountains", "comets", "glaciers", "lighthouses", "violins", "owls", "tides", "deserts", "clocks", "bees", "and", "the", "patient", "work", "of", "engineers", "who", "measured", "everything", "twice", "before", "building", "anything", "once"]


@dataclass(frozen=True)
class BenchmarkConfig:
    """One benchmark run; ``base_url`` ends in ``/v1``."""

    base_url: str
    model: str
    num_prompts: int = 64
    concurrency: int = 8
    max_tokens: int = 128
    prompt_words: int = 64
    request_rate: float = float("inf")  # requests / s (Poisson); inf = all at once
    endpoint: str = "completions"  # or "chat"
    temperature: float = 0.0
    ignore_eos: bool = False  # vLLM / inferpath extension: always produce max_tokens
    api_key: str | None = None
    timeout_s: float = 600.0
    num_warmup: int = 1
    seed: int = 0
    extra_body: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("num_prompts", "concurrency", "max_tokens", "prompt_words"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 (inf = no pacing), got {self.request_rate}")
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint must be 'completions' or 'chat', got {self.endpoint!r}")


def make_prompts(num_prompts: int, num_words: int, seed: int = 0) -> list[str]:
    """Distinct synthetic prompts of ``num_words`` words each (no shared prefix)."""
    rng = random.Random(seed)
    return [f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(num_words)) for i in range(num_prompts)]


def build_request(config: BenchmarkConfig, prompt: str) -> tuple[str, dict]:
    """(url, JSON body) of one streamed request."""
    body: dict = {
        "model": config.model,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.endpoint == "chat":
        url = config.base_url.rstrip("/") + "/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        url = config.base_url.rstrip("/") + "/completions"
        body["prompt"] = prompt
    body.update(config.extra_body)
    return url, body


def parse_sse_line(line: str) -> dict | None:
    """The JSON payload of an SSE ``data:`` line; None for other lines and ``[DONE]``."""
    line = line.strip()
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if not data or data == "[DONE]":
        return None
    return json.loads(data)


def chunk_text(chunk: dict) -> str:
    """The text a completions or chat-completions chunk carries ("" for none)."""
    parts = []
    for choice in chunk.get("choices") or []:
        if "text" in choice:
            parts.append(choice.get("text") or "")
        else:
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


async def send_request(
    client: httpx.AsyncClient, url: str, body: dict, clock: Callable[[], float] = time.perf_counter
) -> RequestResult:
    """Send one streamed request and time its chunks; errors become a failed result."""
    start = clock()
    chunk_times: list[float] = []
    text_parts: list[str] = []
    usage: dict = {}
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:300]
                return RequestResult(False, e2e=clock() - start, error=f"HTTP {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                chunk = parse_sse_line(line)
                if chunk is None:
                    continue
                now = clock()
                if chunk.get("usage"):
                    usage = chunk["usage"]
                text = chunk_text(chunk)
                if text:
                    chunk_times.append(now)
                    text_parts.append(text)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return RequestResult(False, e2e=clock() - start, error=f"{type(exc).__name__}: {exc}")
    end = clock()
    if not chunk_times:
        return RequestResult(False, e2e=end - start, error="the stream carried no text")
    return RequestResult(
        success=True,
        output_tokens=int(usage.get("completion_tokens") or len(chunk_times)),
        ttft=chunk_times[0] - start,
        itl=[b - a for a, b in itertools.pairwise(chunk_times)],
        e2e=end - start,
        prompt_tokens=usage.get("prompt_tokens"),
        text="".join(text_parts),
    )


async def run_benchmark(config: BenchmarkConfig, client: httpx.AsyncClient | None = None) -> tuple[ServingSummary, list[RequestResult]]:
    """Run the warm-up requests, then the timed ones; returns the summary and each result."""
    prompts = make_prompts(config.num_prompts + config.num_warmup, config.prompt_words, config.seed)
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    own_client = client is None
    if client is None:
        client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s),
            limits=httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency),
        )
    try:
        for prompt in prompts[: config.num_warmup]:
            warm = await send_request(client, *build_request(config, prompt))
            if not warm.success:
                raise RuntimeError(f"warm-up request to {config.base_url} failed: {warm.error}")
        semaphore = asyncio.Semaphore(config.concurrency)
        rng = random.Random(config.seed)

        async def limited(prompt: str) -> RequestResult:
            async with semaphore:
                return await send_request(client, *build_request(config, prompt))

        start = time.perf_counter()
        tasks = []
        for prompt in prompts[config.num_warmup :]:
            tasks.append(asyncio.create_task(limited(prompt)))
            if config.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(config.request_rate))
        results = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - start
    finally:
        if own_client:
            await client.aclose()
    return summarize(results, duration), results
