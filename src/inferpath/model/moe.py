"""Mixtures of experts: a router picks top-k SwiGLU experts per token.

``SparseMoE`` (Mixtral): names follow the Mixtral checkpoint layout
(``block_sparse_moe.gate``, ``block_sparse_moe.experts.{e}.w1/w2/w3``; w1 = gate, w3 = up,
w2 = down) so tensors load by name. The routing weights are a softmax over the top-k
router logits, which is the same as Mixtral's softmax over all experts renormalised over
the chosen k.

``RoutedMoE`` (OLMoE, Qwen2-MoE): ``mlp.gate`` is the router, ``mlp.experts.{e}`` are
Llama-named SwiGLU MLPs; the weights are the softmax over all experts at the top k,
renormalised only with ``norm_topk_prob``. Qwen2-MoE adds a shared expert that every
token runs, scaled by ``sigmoid(shared_expert_gate(x))``.

``GroupedSigmoidMoE`` (GLM-4 MoE): the same layout, a sigmoid router whose choice (not
weights) adds a per-expert correction bias and is restricted to the best expert groups,
and ungated shared experts (``mlp.shared_experts``).

``FusedBiasedMoE`` (gpt-oss): ``mlp.router`` (with a bias) picks the top-k logits and
softmaxes them; ``mlp.experts`` holds every expert in four stacked tensors with biases,
gate and up interleaved by column, gated by the clamped SwiGLU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferpath.model.layers import SiluAndMul, SwiGLUMLP


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
        return run_experts(x, self.experts, top_experts, weights)


def run_experts(x: torch.Tensor, experts: nn.ModuleList, top_experts: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor:
    """Sum over each token's chosen experts of weight * expert(x), tokens grouped by expert.

    x: (num_tokens, hidden_size); top_experts, weights: (num_tokens, top_k).
    """
    top_k = top_experts.shape[1]
    flat_experts = top_experts.reshape(-1)  # (num_tokens * top_k,)
    order = torch.argsort(flat_experts, stable=True)
    counts = torch.bincount(flat_experts, minlength=len(experts)).tolist()
    token_of = order // top_k  # token row of each routed (token, slot) pair, grouped by expert
    weight_of = weights.reshape(-1).index_select(0, order)
    out = torch.zeros_like(x)
    start = 0
    for expert, count in zip(experts, counts):
        if count:
            tokens = token_of[start:start + count]
            y = expert(x.index_select(0, tokens)) * weight_of[start:start + count, None]
            out.index_add_(0, tokens, y)
        start += count
    return out


class RoutedMoE(nn.Module):
    """OLMoE / Qwen2-MoE experts under ``mlp`` (module doc): router ``gate``, experts
    ``experts.{e}`` (gate_proj, up_proj, down_proj), optional ``shared_expert`` with its
    one-output ``shared_expert_gate``."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 norm_topk_prob: bool, shared_intermediate_size: int = 0) -> None:
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)  # the router
        self.experts = nn.ModuleList(SwiGLUMLP(hidden_size, intermediate_size) for _ in range(num_experts))
        if shared_intermediate_size:
            self.shared_expert = SwiGLUMLP(hidden_size, shared_intermediate_size)
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)
        else:
            self.shared_expert = self.shared_expert_gate = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden_size)
        probs = F.softmax(self.gate(x).float(), dim=-1)  # (num_tokens, num_experts)
        top_probs, top_experts = torch.topk(probs, self.top_k, dim=-1)  # (num_tokens, top_k)
        if self.norm_topk_prob:
            top_probs = top_probs / top_probs.sum(dim=-1, keepdim=True)
        out = run_experts(x, self.experts, top_experts, top_probs.to(x.dtype))
        if self.shared_expert is not None:
            # every token also runs the shared expert, gated by a sigmoid of one score
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


class GroupedRouter(nn.Module):
    """GLM-4 MoE's router (``mlp.gate``): ``weight`` (num_experts, hidden) and the
    ``e_score_correction_bias`` (num_experts,) that steers the choice only."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.empty(num_experts))


class GroupedSigmoidMoE(nn.Module):
    """Experts chosen by sigmoid scores within the best groups, plus shared experts.

    Per token: scores = sigmoid(router logits) (float32); a group's rank is the sum of its
    two best biased scores; only the best ``num_topk_groups`` groups' experts may be chosen;
    the top k by biased score are chosen, weighted by their *unbiased* scores (renormalised
    with ``norm_topk_prob``) times ``routed_scaling_factor``. transformers' Glm4MoeTopkRouter
    is the reference.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 norm_topk_prob: bool, num_groups: int, num_topk_groups: int, routed_scaling_factor: float,
                 shared_intermediate_size: int) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.num_groups, self.num_topk_groups = num_groups, num_topk_groups
        self.routed_scaling_factor = routed_scaling_factor
        self.gate = GroupedRouter(hidden_size, num_experts)
        self.experts = nn.ModuleList(SwiGLUMLP(hidden_size, intermediate_size) for _ in range(num_experts))
        self.shared_experts = SwiGLUMLP(hidden_size, shared_intermediate_size) if shared_intermediate_size else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden_size)
        scores = F.linear(x.float(), self.gate.weight.float()).sigmoid()  # (num_tokens, num_experts)
        biased = scores + self.gate.e_score_correction_bias.float()
        num_tokens, num_experts = biased.shape
        grouped = biased.view(num_tokens, self.num_groups, num_experts // self.num_groups)
        group_rank = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(dim=-1)  # (num_tokens, num_groups)
        best_groups = group_rank.topk(self.num_topk_groups, dim=-1)[1]
        allowed = torch.zeros_like(group_rank, dtype=torch.bool).scatter_(1, best_groups, True)
        allowed = allowed.unsqueeze(-1).expand_as(grouped).reshape(num_tokens, num_experts)
        top_experts = biased.masked_fill(~allowed, float("-inf")).topk(self.top_k, dim=-1)[1]  # (num_tokens, top_k)
        weights = scores.gather(1, top_experts)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * self.routed_scaling_factor
        out = run_experts(x, self.experts, top_experts, weights.to(x.dtype))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class FusedExperts(nn.Module):
    """gpt-oss's stacked experts, as its checkpoints store them (x @ W, not W x):
    ``gate_up_proj`` (num_experts, hidden, 2 * inter) with gate in the even columns and up
    in the odd ones, ``gate_up_proj_bias`` (num_experts, 2 * inter), ``down_proj``
    (num_experts, inter, hidden), ``down_proj_bias`` (num_experts, hidden)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, limit: float,
                 alpha: float) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden_size, 2 * intermediate_size))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.limit, self.alpha = limit, alpha

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on its tokens x: (num_routed, hidden) -> (num_routed, hidden)."""
        gate_up = torch.addmm(self.gate_up_proj_bias[e], x, self.gate_up_proj[e])  # (num_routed, 2 * inter)
        gate = gate_up[:, 0::2].clamp(max=self.limit)
        up = gate_up[:, 1::2].clamp(min=-self.limit, max=self.limit)
        gated = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))  # the clamped SwiGLU
        return torch.addmm(self.down_proj_bias[e], gated, self.down_proj[e])


class FusedBiasedMoE(nn.Module):
    """gpt-oss's MoE block (module doc): top-k of the biased router's logits, softmaxed."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int, limit: float,
                 alpha: float) -> None:
        super().__init__()
        self.top_k, self.num_experts = top_k, num_experts
        self.router = nn.Linear(hidden_size, num_experts, bias=True)
        # NOTE: forward reads only ``experts.expert``: its blocks may be swapped in from outside
        # (kernels/quant_experts.py)
        self.experts = FusedExperts(hidden_size, intermediate_size, num_experts, limit, alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden_size)
        top_logits, top_experts = torch.topk(self.router(x), self.top_k, dim=-1)  # (num_tokens, top_k)
        weights = F.softmax(top_logits, dim=-1)
        flat = top_experts.reshape(-1)  # (num_tokens * top_k,), grouped by expert below
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        token_of, weight_of = order // self.top_k, weights.reshape(-1).index_select(0, order)
        out = torch.zeros_like(x)
        start = 0
        for e, count in enumerate(counts):
            if count:
                tokens = token_of[start:start + count]
                y = self.experts.expert(e, x.index_select(0, tokens)) * weight_of[start:start + count, None]
                out.index_add_(0, tokens, y.to(x.dtype))
            start += count
        return out
