"""Logit penalties over the tokens a sequence has already seen (OpenAI / vLLM definitions).

All functions are batched over rows, return new tensors and never modify their inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def token_counts(token_lists: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """How often each token occurs in each row's list: (num_rows, vocab_size) float32.

    Ids >= vocab_size (none are expected) land in a scratch column and are dropped.
    """
    num_rows = len(token_lists)
    max_len = max((len(t) for t in token_lists), default=0)
    counts = torch.zeros(num_rows, vocab_size + 1, dtype=torch.float32, device=device)
    if max_len == 0:
        return counts[:, :vocab_size]
    # Pad with the scratch column's index so all rows have the same length.
    padded = [list(t) + [vocab_size] * (max_len - len(t)) for t in token_lists]
    ids = torch.tensor(padded, dtype=torch.long, device=device).clamp_(max=vocab_size)  # (num_rows, max_len)
    counts.scatter_add_(1, ids, torch.ones(ids.shape, dtype=torch.float32, device=device))
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    repetition_penalties: Sequence[float],
    frequency_penalties: Sequence[float],
    presence_penalties: Sequence[float],
) -> torch.Tensor:
    """Penalised copy of ``logits`` (num_rows, vocab_size).

    In this order, per row:
    - repetition (multiplicative, over prompt + output tokens): a seen token's logit is
      divided by the penalty when positive and multiplied by it when negative;
    - frequency: ``logit -= frequency_penalty * count_in_output``;
    - presence: ``logit -= presence_penalty`` if the token occurs in the output.
    A penalty at its neutral value (1, 0, 0) leaves the row unchanged.
    """
    vocab_size = logits.shape[1]
    device = logits.device
    output_counts = token_counts(output_token_ids, vocab_size, device)  # (num_rows, vocab)
    output_mask = output_counts > 0
    logits = logits.clone()
    if any(p != 1.0 for p in repetition_penalties):
        prompt_mask = token_counts(prompt_token_ids, vocab_size, device) > 0
        seen = prompt_mask | output_mask  # (num_rows, vocab)
        # a penalty beyond float32's range acts as the nearest float32 that is > 0 and finite
        finfo = torch.finfo(logits.dtype)
        rep = torch.tensor(repetition_penalties, dtype=torch.float64, device=device)
        rep = rep.clamp(finfo.tiny, finfo.max).to(logits.dtype).unsqueeze(1)
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalised, logits)
    if any(f != 0.0 for f in frequency_penalties):
        freq = torch.tensor(frequency_penalties, dtype=logits.dtype, device=device).unsqueeze(1)
        logits = logits - freq * output_counts
    if any(p != 0.0 for p in presence_penalties):
        pres = torch.tensor(presence_penalties, dtype=logits.dtype, device=device).unsqueeze(1)
        logits = logits - pres * output_mask.to(logits.dtype)
    return logits
