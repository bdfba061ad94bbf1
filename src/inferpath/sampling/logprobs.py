"""Logprobs of the chosen token and the top-N alternatives, for the rows that ask.

They are the log-softmax of the model's raw logits: before penalties, temperature and
top-k/top-p/min-p (what vLLM returns by default), so they describe the model, not the
sampling settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """The chosen token's logprob and rank, and the top-N (token id, logprob) pairs.

    ``rank`` is 1 + the number of tokens strictly more likely than the chosen one
    (1 = the argmax). ``top`` is sorted by decreasing logprob and has N entries, where
    N is the request's ``logprobs``; it may or may not contain the chosen token.
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    rank: int = 1


def compute_logprobs(
    raw_logits: torch.Tensor, token_ids: torch.Tensor, num_top: list[int]
) -> list[TokenLogprobs]:
    """One TokenLogprobs per row.

    raw_logits: (num_rows, vocab) the model's logits; token_ids: (num_rows,) the chosen
    tokens; num_top: N per row (0 = the chosen token's logprob only).
    """
    # (num_rows, vocab); a -inf logprob becomes float32's lowest, so every value is finite
    logprobs = raw_logits.float().log_softmax(dim=-1).clamp_(min=torch.finfo(torch.float32).min)
    chosen = token_ids.unsqueeze(1)  # (num_rows, 1)
    chosen_logprobs = logprobs.gather(1, chosen)  # (num_rows, 1)
    ranks = (logprobs > chosen_logprobs).sum(dim=-1) + 1  # (num_rows,)
    max_top = min(max(num_top, default=0), logprobs.shape[1])  # a vocabulary may be < 20
    if max_top > 0:
        top_values, top_ids = logprobs.topk(max_top, dim=-1)  # (num_rows, max_top)
        top_values_list, top_ids_list = top_values.tolist(), top_ids.tolist()
    else:
        top_values_list = top_ids_list = [[] for _ in num_top]
    results = []
    for row, (token_id, logprob, rank) in enumerate(
        zip(token_ids.tolist(), chosen_logprobs.squeeze(1).tolist(), ranks.tolist())
    ):
        n = num_top[row]
        top = list(zip(top_ids_list[row][:n], top_values_list[row][:n]))
        results.append(TokenLogprobs(token_id=token_id, logprob=logprob, top=top, rank=rank))
    return results
