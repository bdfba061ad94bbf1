"""Serving-benchmark statistics: per-request timings in, latency percentiles and throughput out.

Definitions (the ones vLLM's ``benchmark_serving`` and most serving papers use):

- TTFT: time from sending the request to the first chunk carrying text.
- ITL: the gaps between consecutive text-carrying chunks of one request.
- TPOT: ``(e2e - ttft) / (output_tokens - 1)``, the mean time per output token after
  the first; undefined (None) for a single-token output.
- E2E: time from sending the request to its last chunk.
- Throughput: completed requests, and output tokens, per second of benchmark wall time
  (the first request sent to the last one finished).

Pure Python, no numpy: percentiles interpolate linearly between order statistics
(numpy's default method), so figures agree with other tools' reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """Timings of one streamed request, in seconds from its own start."""

    success: bool
    output_tokens: int = 0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    prompt_tokens: int | None = None
    text: str = ""
    error: str = ""

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100), linear between order statistics."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class LatencyStats:
    """Mean, median, p90 and p99 of one latency, in milliseconds (None without data)."""

    mean_ms: float | None
    median_ms: float | None
    p90_ms: float | None
    p99_ms: float | None

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LatencyStats:
        if not seconds:
            return cls(None, None, None, None)
        ms = [s * 1000.0 for s in seconds]
        p50, p90, p99 = (percentile(ms, q) for q in PERCENTILES)
        return cls(sum(ms) / len(ms), p50, p90, p99)


@dataclass
class ServingSummary:
    """What one benchmark run measured; ``to_dict`` is what gets saved as JSON."""

    num_requests: int
    num_completed: int
    num_failed: int
    duration_s: float
    total_prompt_tokens: int | None
    total_output_tokens: int
    request_throughput: float  # completed requests / s
    output_throughput: float  # output tokens / s
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(results: Sequence[RequestResult], duration_s: float) -> ServingSummary:
    """Aggregate per-request results over a run of ``duration_s`` seconds."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    done = [r for r in results if r.success]
    prompt_counts = [r.prompt_tokens for r in done]
    total_output = sum(r.output_tokens for r in done)
    return ServingSummary(
        num_requests=len(results),
        num_completed=len(done),
        num_failed=len(results) - len(done),
        duration_s=duration_s,
        total_prompt_tokens=sum(prompt_counts) if done and None not in prompt_counts else None,
        total_output_tokens=total_output,
        request_throughput=len(done) / duration_s,
        output_throughput=total_output / duration_s,
        ttft=LatencyStats.of([r.ttft for r in done if r.ttft is not None]),
        tpot=LatencyStats.of([r.tpot for r in done if r.tpot is not None]),
        itl=LatencyStats.of([gap for r in done for gap in r.itl]),
        e2e=LatencyStats.of([r.e2e for r in done]),
        errors=sorted({r.error for r in results if not r.success})[:10],
    )


def format_summary(summary: ServingSummary) -> str:
    """A plain-text table of the summary (the CLI or script prints it)."""

    def num(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    lines = [
        (f"requests          {summary.num_completed} completed / {summary.num_requests} sent"
         f" ({summary.num_failed} failed)"),
        f"duration          {summary.duration_s:.2f} s",
        f"prompt tokens     {summary.total_prompt_tokens if summary.total_prompt_tokens is not None else '-'}",
        f"output tokens     {summary.total_output_tokens}",
        f"request/s         {summary.request_throughput:.3f}",
        f"output tok/s      {summary.output_throughput:.2f}",
        "",
        f"{'latency (ms)':<14}{'mean':>12}{'median':>12}{'p90':>12}{'p99':>12}",
    ]
    for name in ("ttft", "tpot", "itl", "e2e"):
        stats: LatencyStats = getattr(summary, name)
        row = (stats.mean_ms, stats.median_ms, stats.p90_ms, stats.p99_ms)
        lines.append(f"{name.upper():<14}" + "".join(f"{num(v):>12}" for v in row))
    lines.extend(f"error: {e}" for e in summary.errors)
    return "\n".join(lines)
