"""DeepSeek-V3's mixture of experts: sigmoid scores, a correction bias for selection only,
top-k inside the best groups, routed weights scaled, and always-on shared experts.

    scores  = sigmoid(gate(x))                                    (num_tokens, E), float32
    choice  = scores + e_score_correction_bias                    selection only, never weights
    groups  = the topk_group of n_group groups with the largest sum of their two best choices
    experts = top num_experts_per_tok choices inside those groups
    weights = scores at the chosen experts (/ their sum with norm_topk_prob) x routed_scaling_factor
    out     = sum_k weights_k expert_k(x) + shared_experts(x)

Names follow the checkpoint: ``mlp.gate.weight``, ``mlp.gate.e_score_correction_bias``,
``mlp.experts.{e}.{gate,up,down}_proj``, ``mlp.shared_experts.{gate,up,down}_proj``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferpath.config import ModelConfig
from inferpath.model.batch_invariant import rows_must_be_invariant, rowwise_linear
from inferpath.model.layers import SwiGLUMLP
from inferpath.model.moe import run_experts


class GroupedTopKRouter(nn.Module):
    """``gate``: router weight (E, hidden) and the selection bias (E,); returns
    (top experts, weights), each (num_tokens, k)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_experts, self.top_k = config.num_experts, config.num_experts_per_tok
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.norm_topk_prob, self.scaling = config.norm_topk_prob, config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: (num_tokens, hidden_size); routing in float32 whatever the model's dtype
        linear = rowwise_linear if rows_must_be_invariant() else F.linear  # batch-invariant mode: row by row
        scores = linear(x.float(), self.weight.float(), None).sigmoid()  # (num_tokens, E)
        choice = scores + self.e_score_correction_bias.float()
        per_group = choice.view(-1, self.n_group, self.num_experts // self.n_group)  # (T, G, E / G)
        group_scores = per_group.topk(min(2, per_group.shape[-1]), dim=-1).values.sum(dim=-1)  # (T, G)
        best_groups = group_scores.topk(self.topk_group, dim=-1, sorted=False).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)  # (T, G)
        choice = per_group.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(-1, self.num_experts)
        top_experts = choice.topk(self.top_k, dim=-1, sorted=False).indices  # (T, k)
        weights = scores.gather(1, top_experts)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return top_experts, weights * self.scaling


class DeepseekMoE(nn.Module):
    """Routed experts of ``moe_intermediate_size`` plus the shared experts (module doc)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, width = config.hidden_size, config.expert_intermediate_size
        self.gate = GroupedTopKRouter(config)
        self.experts = nn.ModuleList(SwiGLUMLP(h, width) for _ in range(config.num_experts))
        self.shared_experts = (SwiGLUMLP(h, width * config.num_shared_experts)
                               if config.num_shared_experts else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden_size)
        top_experts, weights = self.gate(x)
        out = run_experts(x, self.experts, top_experts, weights.to(x.dtype))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
