"""What the engine hands back: one RequestOutput per request per step it advanced.

Streaming callers read the ``delta_*`` fields (new since the previous output of that
request); batch callers read the cumulative ``text`` / ``token_ids`` of the finished one.

Also the runner's hand-off to the scheduler, ``RunnerOutput`` (torch-free, so the
scheduler and its tests need no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class CompletionOutput:
    """Sample ``index`` (of ``n``) of a request.

    ``finish_reason`` is "stop" (EOS, a stop token or a stop string; which one is
    ``stop_reason``: None for EOS, the token id, or the stop string), "length"
    (max_tokens or the context limit), "abort", "error" (this request alone failed:
    ``error`` says why), or None while unfinished.

    ``token_ids`` and ``logprobs`` are cumulative. NOTE: the engine does not copy them
    each step (that is O(L²) over a request): it hands the sample's append-only lists
    with the length they had, and a read returns that prefix. ``delta_*`` cost nothing.
    """

    __slots__ = (
        "_logprobs",
        "_num_tokens",
        "_token_ids",
        "delta_logprobs",
        "delta_text",
        "delta_token_ids",
        "error",
        "finish_reason",
        "index",
        "stop_reason",
        "text",
    )

    def __init__(self, index: int, text: str, token_ids: list[int], delta_text: str = "",
                 delta_token_ids: list[int] | None = None, logprobs: list[Any] | None = None,
                 delta_logprobs: list[Any] | None = None, finish_reason: str | None = None,
                 stop_reason: int | str | None = None, error: str | None = None,
                 num_tokens: int | None = None):
        self.index = index
        self.text = text
        self._token_ids = token_ids
        self._num_tokens = len(token_ids) if num_tokens is None else num_tokens
        self.delta_text = delta_text
        self.delta_token_ids = [] if delta_token_ids is None else delta_token_ids
        self._logprobs = logprobs
        self.delta_logprobs = delta_logprobs
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.error = error

    @property
    def token_ids(self) -> list[int]:
        return self._token_ids[:self._num_tokens]

    @property
    def logprobs(self) -> list[Any] | None:  # TokenLogprobs per token, when asked for
        return None if self._logprobs is None else self._logprobs[:self._num_tokens]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __repr__(self) -> str:
        return (f"CompletionOutput(index={self.index}, text={self.text!r}, "
                f"token_ids={self.token_ids}, finish_reason={self.finish_reason!r}, "
                f"stop_reason={self.stop_reason!r}, error={self.error!r})")


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
    ``error`` is set when a sample failed alone (its finish_reason is "error").
    """

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    prompt: str | None = None
    prompt_logprobs: list[Any] | None = None  # None, then TokenLogprobs per prompt token

    @property
    def error(self) -> str | None:
        return next((c.error for c in self.outputs if c.error is not None), None)


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
    # speculative decoding: verified chunks, drafted and accepted tokens, accepted by position
    num_spec_drafts: int = 0
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per verification step: 1 + the mean of drafts accepted (vLLM's figure)."""
        if not self.num_spec_drafts:
            return None
        return 1 + self.num_spec_accepted_tokens / self.num_spec_drafts


@dataclass
class RunnerOutput:
    """The runner's hand-off to the scheduler: one entry per sampling chunk, in chunk order.

    ``errors[i]`` is None, or why row i could not be sampled (its logits held NaN, or no
    token was left): that request fails alone. ``token_ids[i]`` is then a placeholder.
    """

    token_ids: list[int]
    logprobs: list[Any] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    # speculative chunks (sampling/rejection.py): sampling index i -> every token the
    # verification emitted (token_ids[i] first: the accepted drafts, then the correction or
    # bonus token) and their logprobs (None entries when not asked)
    runs: dict[int, "TokenRun"] = field(default_factory=dict)

    def error(self, i: int) -> str | None:
        return self.errors[i] if self.errors else None

    def logprob(self, i: int) -> Any:
        return self.logprobs[i] if self.logprobs else None


@dataclass
class TokenRun:
    """What verifying ``num_drafted`` drafted tokens of one sequence gave: ``token_ids``
    (1 + the number accepted; the last is the target's own token) and their logprobs."""

    token_ids: list[int]
    logprobs: list[Any]
    num_drafted: int

    @property
    def num_accepted(self) -> int:
        return len(self.token_ids) - 1
