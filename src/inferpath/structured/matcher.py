"""GrammarMatcher (one sequence's parse state) and the batched bitmask -> logits step.

A bitmask row is ``ceil(vocab / 32)`` int32 words; bit ``i % 32`` of word ``i // 32`` is 1
when token ``i`` is allowed next. ``apply_bitmasks`` expands the constrained rows' words to
booleans and sets the disallowed logits to -inf, leaving free rows untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

_BIT_SHIFTS = torch.arange(32, dtype=torch.int32)  # (32,)


class GrammarMatcher:
    """Where one sequence stands in its grammar.

    Invariant: the tokens passed to ``accept`` are exactly the sequence's output tokens, in
    order (the request calls it from ``append_output``; a preempted request keeps its
    matcher, since it keeps its output tokens).
    """

    def __init__(self, ll_matcher: Any, vocab_size: int) -> None:
        self._matcher = ll_matcher
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32

    def fill_bitmask(self, bitmask_row: torch.Tensor) -> None:
        """Write the allowed-next-token bits into ``bitmask_row``: (num_words,) int32, CPU,
        contiguous."""
        self._matcher.unsafe_compute_mask_ptr(bitmask_row.data_ptr(), self.num_words * 4)

    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False if the grammar did not allow it."""
        return self._matcher.consume_token(token_id)

    @property
    def is_terminated(self) -> bool:
        """True once the grammar is complete and has consumed the EOS token."""
        return self._matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None


def fill_bitmasks(matchers: Sequence[GrammarMatcher]) -> torch.Tensor:
    """(len(matchers), num_words) int32 bitmasks, one row per matcher."""
    bitmask = torch.empty(len(matchers), matchers[0].num_words, dtype=torch.int32)
    for i, matcher in enumerate(matchers):
        matcher.fill_bitmask(bitmask[i])
    return bitmask


def apply_bitmasks(logits: torch.Tensor, row_ids: Sequence[int], bitmask: torch.Tensor) -> torch.Tensor:
    """A copy of ``logits`` (num_rows, vocab) whose rows ``row_ids`` keep only the tokens
    their ``bitmask`` rows (len(row_ids), num_words) allow; other logits become -inf."""
    vocab_size = logits.shape[1]
    bits = (bitmask.unsqueeze(-1) >> _BIT_SHIFTS) & 1  # (k, num_words, 32)
    allowed = bits.view(len(row_ids), -1)[:, :vocab_size].bool().to(logits.device)  # (k, vocab)
    index = torch.tensor(list(row_ids), device=logits.device)
    masked = logits.index_select(0, index).masked_fill(~allowed, float("-inf"))  # (k, vocab)
    return logits.index_copy(0, index, masked)
