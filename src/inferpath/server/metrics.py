"""Prometheus metrics of one server, in a registry of its own (two apps in one process,
as in the tests, never share counters).

Two sources:
- per request, recorded by the handlers when a request finishes: counts by finish
  reason, TTFT / TPOT / end-to-end latency histograms, error responses by status;
- the engine's cumulative ``stats()``, read at scrape time by ``EngineStatsCollector``:
  running and waiting requests, KV blocks used, prefix-cache hit rate, preemptions,
  prompt tokens computed vs served from the prefix cache, generation tokens.

NOTE: the engine's counters live in the engine, so they are exported as Prometheus
counters built at scrape time rather than incremented here; they never go backwards.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "inferpath_"

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class EngineStatsCollector(Collector):
    """Exports an ``EngineStats`` snapshot, taken from ``stats_fn()`` at each scrape."""

    def __init__(self, stats_fn: Callable[[], Any]) -> None:
        self._stats_fn = stats_fn

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats_fn()
        yield _gauge("num_requests_running", "Requests in the running batch.", stats.num_running)
        yield _gauge("num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting)
        yield _gauge("kv_blocks_used", "KV-cache blocks held by requests.",
                     stats.num_kv_blocks_used)
        yield _gauge("kv_blocks_total", "KV-cache blocks in the pool.", stats.num_kv_blocks_total)
        total = max(stats.num_kv_blocks_total, 1)
        yield _gauge("kv_cache_usage_perc", "KV-cache blocks used, percent of the pool.",
                     100.0 * stats.num_kv_blocks_used / total)
        queries, hits = stats.prefix_cache_queries, stats.prefix_cache_hits
        yield _gauge("prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / "
                     "prompt tokens looked up (0 before any lookup).",
                     hits / queries if queries else 0.0)
        yield _counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                       queries)
        yield _counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", hits)
        yield _counter("num_preemptions", "Requests preempted (blocks freed, recomputed later).",
                       stats.num_preemptions)
        yield _counter("prompt_tokens_computed", "Prompt tokens run through the model "
                       "(recomputation after preemption included).",
                       stats.num_prompt_tokens_computed)
        yield _counter("prompt_tokens_cached", "Prompt tokens served from the prefix cache "
                       "instead of being computed.", hits)
        yield _counter("generation_tokens", "Tokens generated.", stats.num_generation_tokens)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


class ServerMetrics:
    """The server's registry: per-request histograms and counters plus the engine's stats."""

    def __init__(self, stats_fn: Callable[[], Any]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineStatsCollector(stats_fn))
        self.request_success = Counter(
            PREFIX + "request_success", "Finished choices by finish reason (stop, length, abort).",
            ["finish_reason"], registry=self.registry)
        self.request_errors = Counter(
            PREFIX + "request_errors", "Error responses by HTTP status.", ["status"],
            registry=self.registry)
        self.prompt_tokens = Counter(
            PREFIX + "prompt_tokens", "Prompt tokens of finished requests (cached or not).",
            registry=self.registry)
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds", "Arrival to first generated token.",
            buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram(
            PREFIX + "time_per_output_token_seconds", "Mean time between output tokens "
            "after the first, per request.", buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram(
            PREFIX + "e2e_request_latency_seconds", "Arrival to the last token.",
            buckets=_LATENCY_BUCKETS, registry=self.registry)

    def record_error(self, status: int) -> None:
        self.request_errors.labels(status=str(status)).inc()

    def record_aborted(self, num_choices: int) -> None:
        """A request given up by the server (client gone): its choices end as "abort"."""
        self.request_success.labels(finish_reason="abort").inc(num_choices)

    def record_finished(self, output: Any) -> None:
        """Record a finished ``RequestOutput`` (all its choices)."""
        for completion in output.outputs:
            self.request_success.labels(finish_reason=completion.finish_reason or "abort").inc()
        self.prompt_tokens.inc(len(output.prompt_token_ids))
        m = output.metrics
        if m is None or m.finished_time is None:
            return
        self.e2e.observe(max(m.finished_time - m.arrival_time, 0.0))
        if m.first_token_time is None:
            return
        self.ttft.observe(max(m.first_token_time - m.arrival_time, 0.0))
        num_tokens = max((len(c.token_ids) for c in output.outputs), default=0)
        if num_tokens > 1:
            self.tpot.observe(max(m.finished_time - m.first_token_time, 0.0) / (num_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
