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


#: In its last CLOSING_HORIZON tokens a structured request is kept closable: a sampled
#: token after which the output could no longer be completed within max_tokens is replaced
#: by the first token of a closing path (GrammarMatcher.within_budget).
CLOSING_HORIZON = 64


def keep_closable(token_ids: torch.Tensor, rows: Sequence[Any]) -> torch.Tensor:
    """``token_ids`` (num_rows,), with the constrained rows steered where needed (a new
    tensor if any changes): a JSON row whose token would make a number longer than its
    type holds or continue a loop inside a value takes the first token of its closing
    path instead (``GrammarMatcher.steer``, json_bounds.py); a row whose grammar could no
    longer be completed within its ``max_tokens`` is steered onto a closing path.

    So a structured answer that max_tokens cuts still parses: it closes early (its last
    tokens are the closing path, then EOS: finish_reason "stop", or "length" where the last
    allowed token closes it). A budget too small for any complete answer is cut as is.
    """
    changed = token_ids
    for i, row in enumerate(rows):
        if row.grammar is None:
            continue
        eos = sorted(row.eos_token_ids)
        token = int(token_ids[i])
        chosen = row.grammar.steer(token, eos)
        max_tokens = row.params.max_tokens
        remaining = None if max_tokens is None else max_tokens - len(row.output_token_ids)
        if remaining is not None and remaining <= CLOSING_HORIZON:  # this token included
            chosen = row.grammar.within_budget(chosen, remaining, eos)
        if chosen != token:
            if changed is token_ids:
                changed = token_ids.clone()
            changed[i] = chosen
    return changed
