"""The sampler's constraint step: logit_bias, then grammar masks, before penalties.

Both touch only the rows that ask (a free row's logits are never changed), and both
return a new tensor (the caller's logits are never modified). The time spent filling and
applying grammar bitmasks is added to ``ConstraintTimer.seconds`` so a benchmark or the
trace can report the cost of structured output per step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch


class ConstraintTimer:
    """Seconds spent on grammar bitmasks (fill + apply) and the steps that needed them."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.num_steps = 0


def apply_logit_bias(logits: torch.Tensor, rows: Sequence[Any]) -> torch.Tensor:
    """``logits`` (num_rows, vocab) plus each row's ``params.logit_bias`` (ids beyond the
    vocabulary are refused earlier, by the engine)."""
    row_ids: list[int] = []
    col_ids: list[int] = []
    values: list[float] = []
    for i, row in enumerate(rows):
        for token_id, bias in row.params.logit_bias:
            row_ids.append(i)
            col_ids.append(token_id)
            values.append(bias)
    if not row_ids:
        return logits
    device = logits.device
    index = (torch.tensor(row_ids, device=device), torch.tensor(col_ids, device=device))
    return logits.index_put(index, torch.tensor(values, dtype=logits.dtype, device=device),
                            accumulate=True)


def apply_grammars(logits: torch.Tensor, rows: Sequence[Any],
                   timer: ConstraintTimer | None = None) -> torch.Tensor:
    """``logits`` with every token a row's grammar does not allow next at -inf (rows with
    ``grammar`` None untouched)."""
    constrained = [i for i, row in enumerate(rows) if row.grammar is not None]
    if not constrained:
        return logits
    from inferpath.structured.matcher import apply_bitmasks, fill_bitmasks

    start = time.perf_counter()
    bitmask = fill_bitmasks([rows[i].grammar for i in constrained])  # (k, num_words)
    logits = apply_bitmasks(logits, constrained, bitmask)
    if timer is not None:
        timer.seconds += time.perf_counter() - start
        timer.num_steps += 1
    return logits
