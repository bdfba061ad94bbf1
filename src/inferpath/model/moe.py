"""Mixtral-style mixture of experts: a router picks top-k SwiGLU experts per token.

Names follow the Mixtral checkpoint layout (``block_sparse_moe.gate``,
``block_sparse_moe.experts.{e}.w1/w2/w3``; w1 = gate, w3 = up, w2 = down) so tensors
load by name. The routing weights are a softmax over the top-k router logits, which is
the same as Mixtral's softmax over all experts renormalised over the chosen k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferpath.model.layers import SiluAndMul


class Expert(nn.Module):
    """One SwiGLU expert: w2(silu(w1 x) * w3 x)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.w3 = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.act_fn = SiluAndMul()
        self.w2 = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_routed_tokens, hidden_size)
        return self.w2(self.act_fn(self.w1(x), self.w3(x)))


class SparseMoE(nn.Module):
    """Top-k routed experts; each token's output is the routing-weighted sum of its k experts.

    NOTE: grouping tokens by expert reads the per-expert counts on the host (one sync per
    layer); a dense formulation would avoid it at num_experts / k times the FLOPs.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)  # the router
        self.experts = nn.ModuleList(Expert(hidden_size, intermediate_size) for _ in range(num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden_size)
        router_logits = self.gate(x)  # (num_tokens, num_experts)
        top_logits, top_experts = torch.topk(router_logits, self.top_k, dim=-1)  # (num_tokens, top_k)
        weights = F.softmax(top_logits.float(), dim=-1).to(x.dtype)
        flat_experts = top_experts.reshape(-1)  # (num_tokens * top_k,)
        order = torch.argsort(flat_experts, stable=True)
        counts = torch.bincount(flat_experts, minlength=len(self.experts)).tolist()
        token_of = order // self.top_k  # token row of each routed (token, slot) pair, grouped by expert
        weight_of = weights.reshape(-1).index_select(0, order)
        out = torch.zeros_like(x)
        start = 0
        for expert, count in zip(self.experts, counts):
            if count:
                tokens = token_of[start:start + count]
                y = expert(x.index_select(0, tokens)) * weight_of[start:start + count, None]
                out.index_add_(0, tokens, y)
            start += count
        return out
