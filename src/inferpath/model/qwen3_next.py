"""Qwen3-Next's full-attention layers: grouped-query attention with an output gate.

``q_proj`` gives each head its query and a gate of head_dim values (2 x head_dim per head,
in that order); q and k are RMSNorm-ed per head (Qwen3-Next's norms scale by 1 + w), RoPE
rotates the first ``partial_rotary_factor`` of each head, attention runs over the paged KV
cache as any layer's, and its output is multiplied by sigmoid(gate) before ``o_proj``.
The linear-attention layers beside them are model/gated_deltanet.py.
"""

from __future__ import annotations

import torch
from torch import nn

from inferpath.config import ModelConfig
from inferpath.model.attention_plan import AttentionPlan
from inferpath.model.rope import RopeTable
from inferpath.model.self_attention import SelfAttention


class GatedSelfAttention(SelfAttention):
    """SelfAttention with Qwen3-Next's output gate and partial rotary (module doc)."""

    def __init__(self, config: ModelConfig, layer_idx: int, rope_table: RopeTable) -> None:
        super().__init__(config, layer_idx, rope_table)
        self.q_proj = nn.Linear(config.hidden_size, 2 * config.q_size, bias=config.attention_bias)
        self.rotary_dim = round(config.head_dim * config.partial_rotary_factor)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_cache,
                plan: dict[int, AttentionPlan]) -> torch.Tensor:
        # x: (num_tokens, hidden_size)
        num_tokens, heads, hd, rot = x.shape[0], self.num_heads, self.head_dim, self.rotary_dim
        q, gate = self.q_proj(x).view(num_tokens, heads, 2 * hd).chunk(2, dim=-1)  # (T, H, hd) each
        k = self.k_proj(x).view(num_tokens, self.num_kv_heads, hd)
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, hd)
        q, k = self.q_norm(q.contiguous()), self.k_norm(k)
        q_rot, k_rot = self.rotary_emb(positions, q[..., :rot].contiguous(), k[..., :rot].contiguous())
        q, k = torch.cat((q_rot, q[..., rot:]), dim=-1), torch.cat((k_rot, k[..., rot:]), dim=-1)
        k_cache, v_cache = kv_cache.k_caches[self.layer_idx], kv_cache.v_caches[self.layer_idx]
        step = plan[self.sliding_window]
        self.kv_write(k, v, k_cache, v_cache, step.slot_mapping)
        out = self.attn(q, k, v, k_cache, v_cache, step).reshape(num_tokens, heads * hd)
        return self.o_proj(out * torch.sigmoid(gate.reshape(num_tokens, heads * hd)))
