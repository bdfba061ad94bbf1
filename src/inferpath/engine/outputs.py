"""What the engine hands back: one RequestOutput per request per step it advanced.

Streaming callers read the ``delta_*`` fields (new since the previous output of that
request); batch callers read the cumulative ``text`` / ``token_ids`` of the finished one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CompletionOutput:
    """Sample ``index`` (of ``n``) of a request.

    ``finish_reason`` is "stop" (EOS, a stop token or a stop string; which one is
    ``stop_reason``: None for EOS, the token id, or the stop string), "length"
    (max_tokens or the context limit), "abort", or None while unfinished.
    """

    index: int
    text: str
    token_ids: list[int]
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] | None = None  # TokenLogprobs per token, when asked for
    delta_logprobs: list[Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Timestamps (time.monotonic()) of a request's life."""

    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    """A request's state after a step: its prompt, its ``n`` samples, whether all ended.

    ``num_cached_tokens`` are the prompt tokens found in the prefix cache, not computed.
    """

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    prompt: str | None = None
    prompt_logprobs: list[Any] | None = None  # None, then TokenLogprobs per prompt token


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for /metrics. Token counters are cumulative since the engine started."""

    num_running: int
    num_waiting: int
    num_kv_blocks_used: int
    num_kv_blocks_total: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens found cached (not computed)
    num_preemptions: int
    num_prompt_tokens_computed: int
    num_generation_tokens: int
    num_requests_finished: int = 0
