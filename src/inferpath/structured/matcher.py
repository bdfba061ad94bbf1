"""GrammarMatcher (one sequence's parse state) and the batched bitmask -> logits step.

A bitmask row is ``ceil(vocab / 32)`` int32 words; bit ``i % 32`` of word ``i // 32`` is 1
when token ``i`` is allowed next. ``apply_bitmasks`` expands the constrained rows' words to
booleans and sets the disallowed logits to -inf, leaving free rows untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


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


def unpack_bitmasks(bitmask: torch.Tensor, vocab_size: int) -> np.ndarray:
    """(k, num_words) int32 bitmasks -> (k, vocab_size) numpy bool, True where allowed.

    NOTE: numpy's unpackbits over the words' little-endian bytes (bit order little) yields
    token 32 w + 8 b + i for bit i of byte b of word w: the bitmask's own layout. It is one
    pass over the bits; torch's shift-and-mask formulation costs ~40x more on CPU.
    """
    raw = bitmask.numpy().view(np.uint8)  # (k, 4 num_words), little-endian words
    bits = np.unpackbits(raw, axis=1, count=vocab_size, bitorder="little")  # (k, vocab) 0/1
    return bits.view(np.bool_)


def apply_bitmasks(logits: torch.Tensor, row_ids: Sequence[int], bitmask: torch.Tensor) -> torch.Tensor:
    """A copy of ``logits`` (num_rows, vocab) whose rows ``row_ids`` keep only the tokens
    their ``bitmask`` rows (len(row_ids), num_words) allow; other logits become -inf.

    NOTE: on CPU this is numpy, single-threaded: a few hundred kB of work, where torch's
    intra-op threads cost more in synchronisation than the work itself on a busy machine.
    """
    allowed = unpack_bitmasks(bitmask, logits.shape[1])  # (k, vocab)
    rows = list(row_ids)
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        values = logits.numpy()
        neg_inf = np.float32(-np.inf)
        if rows == list(range(logits.shape[0])):  # every row constrained
            return torch.from_numpy(np.where(allowed, values, neg_inf))
        masked = values.copy()
        masked[rows] = np.where(allowed, values[rows], neg_inf)
        return torch.from_numpy(masked)
    allowed_t = torch.from_numpy(allowed).to(logits.device)
    neg_inf_t = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    index = torch.tensor(rows, device=logits.device)
    masked_rows = torch.where(allowed_t, logits.index_select(0, index), neg_inf_t)  # (k, vocab)
    return logits.index_copy(0, index, masked_rows)
