"""Llama 4 text's own pieces: its MoE block, the QK L2-norm and the NoPE temperature.

``PrescaledSigmoidMoE`` (``feed_forward`` of an MoE layer): ``router`` picks each token's
top-k logits and turns them into scores by a sigmoid; each chosen expert runs on the token
*times its score* (the scaling is inside the expert's input, not on its output: SwiGLU is
not linear, so the two differ); every token also runs ``shared_expert`` (ungated). The
experts are stored stacked as the checkpoints hold them: ``experts.gate_up_proj``
(num_experts, hidden, 2 * inter), gate in the first half of the columns and up in the
second, and ``experts.down_proj`` (num_experts, inter, hidden), applied as x @ W.
transformers' Llama4TextMoe is the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inferpath.model.layers import SwiGLUMLP


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) over the last dimension, in float32 and back (no weight): Llama 4's
    QK-norm. x: (num_tokens, heads, head_dim)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def temperature_scales(positions: torch.Tensor, floor_scale: int, attn_scale: float) -> torch.Tensor:
    """(num_tokens,) float32 factors on the queries of a NoPE layer:
    1 + attn_scale * log1p(floor((position + 1) / floor_scale)); 1 below floor_scale."""
    return torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0


class StackedExperts(nn.Module):
    """Llama 4's experts in two stacked tensors (module doc); ``expert(e, x)`` runs one."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden_size, 2 * intermediate_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.intermediate_size = intermediate_size

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """x: (num_routed, hidden) -> (num_routed, hidden)."""
        gate_up = x @ self.gate_up_proj[e]  # (num_routed, 2 * inter)
        gate, up = gate_up[:, :self.intermediate_size], gate_up[:, self.intermediate_size:]
        return (up * F.silu(gate)) @ self.down_proj[e]


class PrescaledSigmoidMoE(nn.Module):
    """Llama 4's MoE layer (module doc)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 shared_intermediate_size: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = StackedExperts(hidden_size, intermediate_size, num_experts)
        self.shared_expert = SwiGLUMLP(hidden_size, shared_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (num_tokens, hidden_size)
        top_logits, top_experts = torch.topk(self.router(x), self.top_k, dim=-1)  # (num_tokens, top_k)
        scores = torch.sigmoid(top_logits.float()).to(x.dtype)
        flat = top_experts.reshape(-1)  # (num_tokens * top_k,), grouped by expert below
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.experts.gate_up_proj.shape[0]).tolist()
        token_of, score_of = order // self.top_k, scores.reshape(-1).index_select(0, order)
        routed = torch.zeros_like(x)
        start = 0
        for e, count in enumerate(counts):
            if count:
                tokens = token_of[start:start + count]
                routed_in = x.index_select(0, tokens) * score_of[start:start + count, None]
                routed.index_add_(0, tokens, self.experts.expert(e, routed_in).to(x.dtype))
            start += count
        return self.shared_expert(x) + routed
