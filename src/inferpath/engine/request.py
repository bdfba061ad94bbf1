"""Request: one sequence being generated, and where it stands. Imports no torch.

A request is its tokens (prompt + output so far) and how many of them have their K/V in
the cache (``num_computed_tokens``). Prefill and decode are the same thing: computing
more of its tokens. It also owns what must survive a preemption unchanged: its output
tokens and its random generator (never reset, so a resumed request draws exactly the
tokens it would have drawn). Its text, stop strings and logprobs live in the output
processor (engine/output_processor.py), outside the core loop.

Invariants:
- ``all_token_ids == prompt_token_ids + output_token_ids``;
- ``0 <= num_computed_tokens <= num_tokens``, and ``< num_tokens`` while running;
- only the scheduler changes ``status`` (the output processor asks it to, for a stop
  string).
"""

from __future__ import annotations

import enum
import time
from typing import Any

from inferpath.sampling.params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, to be recomputed
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # this request alone failed (e.g. its logits became NaN)

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR)

    @property
    def finish_reason(self) -> str | None:
        return self.value if self.is_finished else None


class Request:
    """Sequence ``index`` (of ``params.n``) of the user's request ``request_id``.

    ``seq_id == (request_id, index)`` names it to the scheduler and the block manager.
    ``generator`` is the sampler's per-sequence RNG (a torch.Generator, or None).
    ``grammar`` is the sequence's ``GrammarMatcher`` (structured output) or None; every
    output token is fed to it. ``prompt_logprobs`` (sample 0 of a request that asks) holds
    None for prompt token 0, then the runner appends one entry per prompt token
    (engine/prompt_logprobs.py). ``error`` says why a request finished with status
    FINISHED_ERROR. ``row_invariant``: its rows run in the step's batch-invariant sub-batch
    and its KV blocks are cached apart (``EngineConfig.deterministic_seeded``, a seeded
    request; engine/row_passes.py).
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 *, index: int = 0, eos_token_ids: frozenset[int] = frozenset(),
                 generator: Any = None, grammar: Any = None,
                 arrival_time: float | None = None, row_invariant: bool = False):
        self.request_id = request_id
        self.index = index
        self.seq_id = (request_id, index)
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.max_model_len: int | None = None  # set by the scheduler when added
        self.generator = generator
        self.grammar = grammar
        self.row_invariant = row_invariant
        self.all_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.prompt_logprobs: list | None = (
            [None] if params.prompt_logprobs is not None and index == 0 else None)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hit at first admission
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        # speculative decoding (engine/spec/): tokens drafted past the last one, verified at
        # the next step; the draft model's distributions they were drawn from, (k, vocab),
        # or None (a point mass: ngram, or greedy); and the acceptance record that decides
        # whether to draft at all. Never part of all_token_ids.
        self.spec_token_ids: list[int] = []
        self.spec_draft_probs: Any = None
        self.spec_acceptance: Any = None

    # ------------------------------------------------------------------ sizes
    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def finish_reason(self) -> str | None:
        return self.status.finish_reason

    # ------------------------------------------------------------------ growth (scheduler)
    def append_output(self, token_id: int) -> None:
        """Add a sampled token (the scheduler then checks whether it ends the request)."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        if self.grammar is not None:
            # NOTE: the sampler masked every other token, so this only fails on EOS after a
            # complete grammar; that token ends the request anyway.
            self.grammar.accept(token_id)

    def finish(self, status: RequestStatus, stop_reason: int | str | None = None) -> None:
        """Mark finished. The first call wins, except that a stop string found in the last
        token's text restates a token stop or "length" end as a stop string (what a
        stream reading the text would have seen first)."""
        restates = (status is RequestStatus.FINISHED_STOPPED and self.status in (
            RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH))
        if self.status.is_finished and not restates:
            return
        self.status = status
        self.stop_reason = stop_reason
        if self.finished_time is None:
            self.finished_time = time.monotonic()
