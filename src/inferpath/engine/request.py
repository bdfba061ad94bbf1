"""Request: one sequence being generated, and where it stands. Imports no torch.

A request is its tokens (prompt + output so far) and how many of them have their K/V in
the cache (``num_computed_tokens``). Prefill and decode are the same thing: computing
more of its tokens. It also owns what must survive a preemption unchanged: its output
tokens, its text, and its random generator (never reset, so a resumed request draws
exactly the tokens it would have drawn).

Invariants:
- ``all_token_ids == prompt_token_ids + output_token_ids``;
- ``0 <= num_computed_tokens <= num_tokens``, and ``< num_tokens`` while running;
- ``output_text`` never contains a stop string (unless ``include_stop_str_in_output``);
  text that could be the start of one is held back from streaming until settled.
"""

from __future__ import annotations

import enum
import time
from typing import Any

from inferpath.sampling.params import SamplingParams
from inferpath.sampling.stop import check_stop, find_stop_string, num_chars_to_hold_back


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, to be recomputed
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED)

    @property
    def finish_reason(self) -> str | None:
        return self.value if self.is_finished else None


class Request:
    """Sequence ``index`` (of ``params.n``) of the user's request ``request_id``.

    ``seq_id == (request_id, index)`` names it to the scheduler and the block manager.
    ``generator`` is the sampler's per-sequence RNG (a torch.Generator, or None);
    ``detokenizer`` has ``add(token_id) -> str`` and ``flush() -> str`` (or is None:
    token ids only, no text and no stop strings). ``grammar`` is the sequence's
    ``GrammarMatcher`` (structured output) or None; every output token is fed to it.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 *, index: int = 0, eos_token_ids: frozenset[int] = frozenset(),
                 generator: Any = None, grammar: Any = None,
                 detokenizer: Any = None, arrival_time: float | None = None):
        self.request_id = request_id
        self.index = index
        self.seq_id = (request_id, index)
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.max_model_len: int | None = None  # set by the scheduler when added
        self.generator = generator
        self.grammar = grammar
        self.detokenizer = detokenizer
        self.all_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.logprobs: list | None = [] if params.logprobs is not None else None
        # prompt token 0 has no logprob; the runner appends the others (prompt_logprobs.py)
        # (sample 0 only: the others share its prompt)
        self.prompt_logprobs: list | None = (
            [None] if params.prompt_logprobs is not None and index == 0 else None)
        self.output_text = ""
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hit at first admission
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        # what take_delta() has handed out so far
        self._num_sent_chars = 0
        self._num_sent_tokens = 0

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

    # ------------------------------------------------------------------ growth
    def append_output(self, token_id: int, logprobs: Any = None) -> None:
        """Add a sampled token; detokenize it; finish the request if it should stop."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if self.logprobs is not None:
            self.logprobs.append(logprobs)
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        if self.grammar is not None:
            # NOTE: the sampler masked every other token, so this only fails on EOS after a
            # complete grammar; that token ends the request anyway.
            self.grammar.accept(token_id)
        stop = check_stop(token_id, self.num_output_tokens, self.params, self.eos_token_ids,
                          num_prompt_tokens=self.num_prompt_tokens,
                          max_model_len=self.max_model_len)
        if self.detokenizer is not None:
            delta = self.detokenizer.add(token_id)
            if stop is not None:
                delta += self.detokenizer.flush()
            if self._add_text(delta):
                return  # a stop string ended it
        if stop is not None:
            reason, self.stop_reason = stop
            self.finish(RequestStatus.FINISHED_STOPPED if reason == "stop"
                        else RequestStatus.FINISHED_LENGTH)

    def _add_text(self, delta: str) -> bool:
        """Append text; cut it and finish at a stop string. Returns True if stopped."""
        self.output_text += delta
        params = self.params
        if not params.stop or self.num_output_tokens < params.min_tokens:
            return False
        found = find_stop_string(self.output_text, params.stop, len(delta),
                                 params.include_stop_str_in_output)
        if found is None:
            return False
        cut, self.stop_reason = found
        self.output_text = self.output_text[:cut]
        self.finish(RequestStatus.FINISHED_STOPPED)
        return True

    def finish(self, status: RequestStatus) -> None:
        if self.status.is_finished:
            return
        self.status = status
        self.finished_time = time.monotonic()

    # ------------------------------------------------------------------ streaming
    @property
    def streamed_text(self) -> str:
        """The text handed out by ``take_delta`` so far (held-back characters excluded)."""
        return self.output_text[:self._num_sent_chars]

    def take_delta(self) -> tuple[str, list[int], list | None]:
        """Text, token ids and logprobs produced since the last call.

        While running, text that could be the start of a stop string is held back.
        """
        end = len(self.output_text)
        if not self.status.is_finished and self.params.stop:
            end -= num_chars_to_hold_back(self.output_text, self.params.stop)
        end = max(end, self._num_sent_chars)
        text = self.output_text[self._num_sent_chars:end]
        token_ids = self.output_token_ids[self._num_sent_tokens:]
        logprobs = self.logprobs[self._num_sent_tokens:] if self.logprobs is not None else None
        self._num_sent_chars = end
        self._num_sent_tokens = self.num_output_tokens
        return text, token_ids, logprobs
