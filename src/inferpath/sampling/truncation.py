"""Top-k, top-p and min-p: mask the unlikely tail of each row's distribution with -inf.

Batched over rows; each row has its own k, p and min-p, with a neutral value that
leaves it untouched (k = 0, p = 1, min_p = 0). Applied in that order, to logits already
divided by the temperature, so every cut is on the distribution that is sampled. The
kept tokens are then sampled from the renormalised softmax.

Each rule comes down to a per-row threshold logit, and a token is kept when its logit is
>= every threshold of its row. So the kept set depends only on values, never on a sort
order: a token tied with the last kept one is kept too.

NOTE: no full-vocabulary sort in the common case. top-k needs only the k largest
logits, and top-p the most likely tokens until their mass reaches p: the first
``NUM_TOP_P_CANDIDATES`` of them cover it for any peaked distribution, and rows they
do not cover fall back to a full sort. (A full sort of 150k logits costs ~20x a top-1024.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: How many of the most likely tokens top-p looks at before falling back to a full sort.
NUM_TOP_P_CANDIDATES = 1024


def apply_truncation(
    logits: torch.Tensor,
    top_k: Sequence[int] | None = None,
    top_p: Sequence[float] | None = None,
    min_p: Sequence[float] | None = None,
) -> torch.Tensor:
    """Masked copy of ``logits`` (num_rows, vocab_size); None = the rule is off for all rows.

    - top-k keeps the tokens whose logit is >= the row's k-th largest (k = 0: all).
    - top-p keeps the smallest set of most likely tokens whose mass reaches p, of the
      distribution left by top-k, renormalised (p = 1: all). The top token always stays.
    - min-p keeps tokens with probability >= min_p x the top token's, i.e. logit >=
      max_logit + log(min_p); earlier cuts keep the top token, so order does not matter.
    """
    num_rows = logits.shape[0]
    threshold = logits.new_full((num_rows, 1), float("-inf"))  # (num_rows, 1)
    if top_k is not None or top_p is not None:
        threshold = _top_k_top_p_threshold(
            logits, list(top_k) if top_k is not None else [0] * num_rows,
            list(top_p) if top_p is not None else [1.0] * num_rows,
        )
    if min_p is not None:
        log_min_p = torch.tensor(min_p, dtype=logits.dtype, device=logits.device).log().unsqueeze(1)
        threshold = torch.maximum(threshold, logits.amax(dim=-1, keepdim=True) + log_min_p)
    return logits.masked_fill(logits < threshold, float("-inf"))


def _top_k_top_p_threshold(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Per-row threshold logit of top-k then top-p: (num_rows, 1)."""
    vocab_size = logits.shape[1]
    top_k = [min(k, vocab_size) if k > 0 else 0 for k in top_k]
    # How many of the largest logits each row needs to see.
    needed = [k if k > 0 else (min(vocab_size, NUM_TOP_P_CANDIDATES) if p < 1.0 else 1) for k, p in zip(top_k, top_p)]
    candidates = logits.topk(max(needed), dim=-1).values  # (num_rows, num_candidates), descending
    threshold, uncovered = _threshold_from_candidates(candidates, logits, top_k, top_p)
    if uncovered:
        full = logits[uncovered].sort(dim=-1, descending=True).values  # (num_uncovered, vocab)
        threshold[uncovered] = _threshold_from_candidates(
            full, logits[uncovered], [top_k[i] for i in uncovered], [top_p[i] for i in uncovered]
        )[0]
    return threshold


def _threshold_from_candidates(
    candidates: torch.Tensor, logits: torch.Tensor, top_k: list[int], top_p: list[float]
) -> tuple[torch.Tensor, list[int]]:
    """Thresholds from each row's largest logits, sorted descending (num_rows, C).

    Returns (threshold (num_rows, 1), rows whose top-p set may extend past the C
    candidates and must be recomputed on a full sort).
    """
    device = candidates.device
    num_candidates = candidates.shape[1]
    k_on = torch.tensor([k > 0 for k in top_k], device=device).unsqueeze(1)  # (num_rows, 1)
    k_index = torch.tensor([k - 1 if k > 0 else 0 for k in top_k], device=device).unsqueeze(1)
    threshold = torch.where(k_on, candidates.gather(1, k_index), float("-inf"))  # (num_rows, 1)
    if all(p >= 1.0 for p in top_p):
        return threshold, []
    kept = candidates.masked_fill(candidates < threshold, float("-inf"))  # (num_rows, C)
    # Normaliser: over the top-k set (all inside the candidates) when top-k is on, else
    # over the whole row.
    log_norm = torch.where(k_on, kept.logsumexp(dim=-1, keepdim=True), logits.logsumexp(dim=-1, keepdim=True))
    probs = (kept - log_norm).exp()  # (num_rows, C)
    cumulative = probs.cumsum(dim=-1)
    p = torch.tensor(top_p, dtype=probs.dtype, device=device).unsqueeze(1)  # (num_rows, 1)
    # Tokens kept: those with less than p of mass strictly before them.
    num_kept = (cumulative - probs < p).sum(dim=-1, keepdim=True).clamp_(min=1, max=num_candidates)
    threshold_p = torch.where(p < 1.0, candidates.gather(1, num_kept - 1), float("-inf"))
    threshold = torch.maximum(threshold, threshold_p)
    uncovered: list[int] = []
    if num_candidates < logits.shape[1]:
        short = (p < 1.0) & ~k_on & (cumulative[:, -1:] < p)  # (num_rows, 1)
        uncovered = torch.nonzero(short[:, 0]).flatten().tolist()
    return threshold, uncovered
