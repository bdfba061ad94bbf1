"""Top-k, top-p and min-p: mask the unlikely tail of each row's distribution with -inf.

Batched over rows; each row has its own k, p and min-p, with a neutral value that
leaves it untouched (k = 0, p = 1, min_p = 0). Applied in that order, to logits that
are already divided by the temperature, so every cut is on the distribution that is
actually sampled. The kept tokens are then sampled from the renormalised softmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: Sequence[int] | None, top_p: Sequence[float] | None
) -> torch.Tensor:
    """Masked copy of ``logits`` (num_rows, vocab_size).

    - top-k keeps every token whose logit is >= the row's k-th largest logit (so ties
      with the k-th token are all kept); k = 0 keeps all.
    - top-p then keeps the smallest prefix of the tokens sorted by probability (of the
      distribution left by top-k, renormalised) whose mass reaches p; the most likely
      token is always kept; p = 1 keeps all. Among exactly tied probabilities the sort
      order decides which are inside the prefix.
    """
    num_rows, vocab_size = logits.shape
    device = logits.device
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)  # (num_rows, vocab)
    if top_k is not None:
        k = torch.tensor([vocab_size if x <= 0 else min(x, vocab_size) for x in top_k], device=device)
        kth_logit = sorted_logits.gather(1, (k - 1).unsqueeze(1))  # (num_rows, 1)
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_logit, float("-inf"))
    if top_p is not None:
        p = torch.tensor(top_p, dtype=torch.float32, device=device).unsqueeze(1)  # (num_rows, 1)
        probs = sorted_logits.softmax(dim=-1)
        # Mass of the tokens strictly more likely than each token (exclusive cumsum).
        mass_before = torch.nn.functional.pad(torch.cumsum(probs, dim=-1)[:, :-1], (1, 0))
        remove = (mass_before >= p) & (p < 1.0)
        remove[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_ids, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: Sequence[float]) -> torch.Tensor:
    """Masked copy of ``logits``: keep tokens with prob >= min_p x the row's top prob.

    NOTE: computed on logits, ``logit >= max_logit + log(min_p)``, which is the same
    test without a softmax; it is unchanged by any earlier masking that keeps the top
    token (top-k and top-p always do), so its place in the order does not matter.
    """
    threshold = torch.tensor(min_p, dtype=torch.float32, device=logits.device).log().unsqueeze(1)
    max_logit = logits.amax(dim=-1, keepdim=True)  # (num_rows, 1)
    return logits.masked_fill(logits < max_logit + threshold, float("-inf"))
