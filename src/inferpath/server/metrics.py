"""Prometheus metrics of one server, in a registry of its own (two apps in one process,
as in the tests, never share counters).

Two sources:
- per request, recorded by the handlers when a request finishes: counts by finish
  reason, TTFT / TPOT / end-to-end latency histograms, error responses by status;
- the engine's cumulative ``stats()``, read at scrape time by ``EngineStatsCollector``:
  running and waiting requests, KV blocks used, prefix-cache hit rate, preemptions,
  prompt tokens computed vs served from the prefix cache, generation tokens, and
  speculative decoding's drafts, drafted and accepted tokens (by position).

Names, units and labels follow vLLM's (``vllm:`` -> ``inferpath:``), so a dashboard built
for vLLM works after swapping the prefix: every metric carries ``model_name``, finished
requests are counted by ``finished_reason``, ``kv_cache_usage_perc`` is a fraction (0-1).
The glass-box extras (KV blocks, prompt tokens computed vs cached, the prefix-cache hit
rate, error responses by status) share the prefix.

NOTE: the engine's counters live in the engine, so they are exported as Prometheus
counters built at scrape time rather than incremented here; they never go backwards.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "inferpath:"
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class EngineStatsCollector(Collector):
    """Exports an ``EngineStats`` snapshot, taken from ``stats_fn()`` at each scrape."""

    def __init__(self, stats_fn: Callable[[], Any], model_name: str) -> None:
        self._stats_fn = stats_fn
        self._model_name = model_name

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats_fn()
        gauge, counter = self._gauge, self._counter
        yield gauge("num_requests_running", "Requests in the running batch.", stats.num_running)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting)
        yield gauge("kv_blocks_used", "KV-cache blocks held by requests.",
                    stats.num_kv_blocks_used)
        yield gauge("kv_blocks_total", "KV-cache blocks in the pool.", stats.num_kv_blocks_total)
        total = max(stats.num_kv_blocks_total, 1)
        yield gauge("kv_cache_usage_perc", "KV-cache usage: blocks used / blocks in the pool "
                    "(1 = full).", stats.num_kv_blocks_used / total)
        queries, hits = stats.prefix_cache_queries, stats.prefix_cache_hits
        yield gauge("prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / "
                    "prompt tokens looked up (0 before any lookup).",
                    hits / queries if queries else 0.0)
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      queries)
        yield counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", hits)
        yield counter("num_preemptions", "Requests preempted (blocks freed, recomputed later).",
                      stats.num_preemptions)
        yield counter("prompt_tokens_computed", "Prompt tokens run through the model "
                      "(recomputation after preemption included).",
                      stats.num_prompt_tokens_computed)
        yield counter("prompt_tokens_cached", "Prompt tokens served from the prefix cache "
                      "instead of being computed.", hits)
        yield counter("generation_tokens", "Tokens generated.", stats.num_generation_tokens)
        # speculative decoding, as vLLM names it (spec_decode_*); 0 while it is off
        yield counter("spec_decode_num_drafts", "Speculative verification steps of a sequence "
                      "(chunks of drafted tokens verified).", stats.num_spec_drafts)
        yield counter("spec_decode_num_draft_tokens", "Drafted tokens verified.",
                      stats.num_spec_draft_tokens)
        yield counter("spec_decode_num_accepted_tokens", "Drafted tokens accepted.",
                      stats.num_spec_accepted_tokens)
        per_pos = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                      "Drafted tokens accepted, by position in the draft.",
                                      labels=["model_name", "position"])
        for position, count in enumerate(stats.spec_accepted_per_pos):
            per_pos.add_metric([self._model_name, str(position)], count)
        yield per_pos

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
        family.add_metric([self._model_name], value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
        family.add_metric([self._model_name], value)
        return family


class ServerMetrics:
    """The server's registry: per-request histograms and counters plus the engine's stats."""

    def __init__(self, stats_fn: Callable[[], Any], model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        self._engine_stats = EngineStatsCollector(stats_fn, model_name)
        self.registry.register(self._engine_stats)
        self.model_name = model_name
        registry, model = self.registry, ["model_name"]
        self.request_success = Counter(
            PREFIX + "request_success", "Finished choices by finish reason (stop, length, "
            "abort, tool_calls).", ["model_name", "finished_reason"], registry=registry)
        self.request_errors = Counter(
            PREFIX + "request_errors", "Error responses by HTTP status.",
            ["model_name", "status"], registry=registry)
        self.prompt_tokens = Counter(
            PREFIX + "prompt_tokens", "Prompt tokens of finished requests (cached or not).",
            model, registry=registry)
        self.request_prompt_tokens = Histogram(
            PREFIX + "request_prompt_tokens", "Prompt tokens per finished request.", model,
            buckets=_TOKEN_BUCKETS, registry=registry)
        self.request_generation_tokens = Histogram(
            PREFIX + "request_generation_tokens", "Generated tokens per finished request "
            "(all choices).", model, buckets=_TOKEN_BUCKETS, registry=registry)
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds", "Arrival to first generated token.", model,
            buckets=_LATENCY_BUCKETS, registry=registry)
        self.tpot = Histogram(
            PREFIX + "time_per_output_token_seconds", "Mean time between output tokens "
            "after the first, per request.", model, buckets=_LATENCY_BUCKETS, registry=registry)
        self.e2e = Histogram(
            PREFIX + "e2e_request_latency_seconds", "Arrival to the last token.", model,
            buckets=_LATENCY_BUCKETS, registry=registry)

    def release(self) -> None:
        """Drop the engine's stats (ServingContext.release): the request metrics stay."""
        if self._engine_stats is not None:
            self.registry.unregister(self._engine_stats)
            self._engine_stats = None

    def record_error(self, status: int) -> None:
        self.request_errors.labels(model_name=self.model_name, status=str(status)).inc()

    def record_aborted(self, num_choices: int) -> None:
        """A request given up by the server (client gone): its choices end as "abort"."""
        self.request_success.labels(model_name=self.model_name,
                                    finished_reason="abort").inc(num_choices)

    def record_finished(self, output: Any) -> None:
        """Record a finished ``RequestOutput`` (all its choices)."""
        model = self.model_name
        for completion in output.outputs:
            self.request_success.labels(model_name=model,
                                        finished_reason=completion.finish_reason or "abort").inc()
        self.prompt_tokens.labels(model_name=model).inc(len(output.prompt_token_ids))
        self.request_prompt_tokens.labels(model_name=model).observe(len(output.prompt_token_ids))
        self.request_generation_tokens.labels(model_name=model).observe(
            sum(len(c.token_ids) for c in output.outputs))
        m = output.metrics
        if m is None or m.finished_time is None:
            return
        self.e2e.labels(model_name=model).observe(max(m.finished_time - m.arrival_time, 0.0))
        if m.first_token_time is None:
            return
        self.ttft.labels(model_name=model).observe(max(m.first_token_time - m.arrival_time, 0.0))
        num_tokens = max((len(c.token_ids) for c in output.outputs), default=0)
        if num_tokens > 1:
            self.tpot.labels(model_name=model).observe(
                max(m.finished_time - m.first_token_time, 0.0) / (num_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
