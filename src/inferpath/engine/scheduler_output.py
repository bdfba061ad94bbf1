"""What the scheduler hands on, in typed objects. Imports no torch.

``Scheduler.schedule`` returns a ``SchedulerOutput`` (a step's ``ScheduledChunk``s, in
batch order), which the runner turns into tensors; ``Scheduler.update`` returns one
``SampleUpdate`` per request it advanced, which the output processor turns into text; its
running counts, ``SchedulerStats``, go into the engine's stats (``LLMEngine.stats``).
``inferpath.engine.scheduler`` re-exports all four.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferpath.engine.request import Request


@dataclass(frozen=True)
class ScheduledChunk:
    """Compute the tokens at positions [start, end) of ``request``.

    ``start`` is the request's ``num_computed_tokens`` when scheduled. ``samples`` is
    True when the chunk reaches the request's last token: its logits are sampled.
    ``draft_token_ids`` (speculative decoding) are the last ``len(draft_token_ids)`` of
    the ``num_new_tokens``: drafted tokens past the request's last one, to verify.
    """

    request: Request
    start: int
    num_new_tokens: int
    samples: bool
    draft_token_ids: tuple[int, ...] = ()

    @classmethod
    def of(cls, request: Request, num_new_tokens: int,
           draft_token_ids: tuple[int, ...] = ()) -> ScheduledChunk:
        start = request.num_computed_tokens
        samples = start + num_new_tokens - len(draft_token_ids) == request.num_tokens
        return cls(request, start, num_new_tokens, samples, draft_token_ids)

    @property
    def end(self) -> int:
        return self.start + self.num_new_tokens


@dataclass
class SchedulerOutput:
    """One step's work, in batch order (decodes first). Read by the runner."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # requests finished by the scheduler itself (aborted, or out of cache when alone)
    finished: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass
class SampleUpdate:
    """What one step did to one request: the token it got (or None: it finished without
    one, e.g. aborted or failed) and that token's logprobs. Read by the output processor."""

    request: Request
    token_id: int | None = None
    logprobs: object = None
    # False for all but the last of several tokens one step gave a request (a verified
    # speculative run): the output processor flushes a finished request's text only at its last
    is_last: bool = True


@dataclass
class SchedulerStats:
    """Counts since the scheduler started, read into ``EngineStats`` (metrics, CLI summary)."""

    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up at first admission
    prefix_cache_hits: int = 0  # of which found in the cache
    num_prompt_tokens_computed: int = 0  # prompt tokens actually run through the model
    num_generation_tokens: int = 0
    # speculative decoding: verified chunks, their drafted tokens, the accepted ones, and
    # accepted counts by draft position (vLLM's spec_decode metrics)
    num_spec_drafts: int = 0
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
