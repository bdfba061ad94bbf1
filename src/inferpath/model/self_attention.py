"""The attention block of one layer: Q/K/V projections, RoPE, cache write, attention, W_O.

Every stage is its own submodule under Hugging Face's name, so a tracer can time each one
with forward hooks from outside and checkpoint tensors load by name:
``q_proj``/``k_proj``/``v_proj`` -> ``rotary_emb`` -> ``kv_write`` -> ``attn`` -> ``o_proj``.
"""

from __future__ import annotations

import torch
from torch import nn

from inferpath.config import ModelConfig
from inferpath.model.attention import KVWrite, PagedAttention
from inferpath.model.attention_plan import AttentionPlan
from inferpath.model.layers import make_norm
from inferpath.model.llama4 import l2_norm, temperature_scales
from inferpath.model.rope import PartialRotaryEmbedding, RopeTable, RotaryEmbedding


class SelfAttention(nn.Module):
    """Grouped-query self-attention of layer ``layer_idx`` over the paged KV cache.

    Q is ``num_heads * head_dim`` wide, K and V ``num_kv_heads * head_dim``; only K and V
    are kept (in the cache), Q is discarded after use. Qwen2 adds a bias to Q, K and V, Llama's
    ``attention_bias`` to all four projections. A sliding-window layer reads the plan of its window;
    a NoPE layer (``no_rope_layers``) has no ``rotary_emb``.
    """

    def __init__(self, config: ModelConfig, layer_idx: int, rope_table: RopeTable) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.q_size, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.kv_size, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.kv_size, bias=bias)
        # SmolLM3's NoPE layers: position enters only through the causal mask
        rotary = PartialRotaryEmbedding if config.rotary_dim not in (0, config.head_dim) else RotaryEmbedding
        self.rotary_emb = rotary(rope_table) if layer_idx not in config.no_rope_layers else None
        self.kv_write = KVWrite()
        self.attn = PagedAttention()
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=config.o_proj_bias)
        self.sliding_window = config.layer_window(layer_idx)  # 0: full attention
        # the plan this layer reads: its window's, or (Llama 4) its attention chunk's
        chunk = config.layer_chunk(layer_idx)
        self.plan_key = ("chunk", chunk) if chunk else self.sliding_window
        # Llama 4: an L2 norm of Q and K after RoPE on the RoPE layers; a position-dependent
        # factor on Q of the NoPE layers (model/llama4.py)
        self.l2_qk_norm_eps = (config.rms_norm_eps if config.qk_norm == "l2_rope" and self.rotary_emb is not None
                               else None)
        self.temperature = ((config.attn_temperature_floor, config.attn_temperature_scale)
                            if config.attn_temperature_floor and self.rotary_emb is None else None)
        # RMSNorm on Q and K before RoPE: over all heads at once (OLMoE) or per head (Gemma 3)
        self.qk_norm = config.qk_norm
        q_width, k_width = (config.q_size, config.kv_size) if config.qk_norm == "projection" else (
            config.head_dim, config.head_dim)
        # gpt-oss: a learned logit per head in every softmax's denominator
        self.sinks = nn.Parameter(torch.empty(config.num_heads)) if config.attention_sinks else None
        weighted_qk_norm = config.qk_norm in ("projection", "head")
        self.q_norm = make_norm(q_width, config.rms_norm_eps, config.norm_weight_offset) if weighted_qk_norm else None
        self.k_norm = make_norm(k_width, config.rms_norm_eps, config.norm_weight_offset) if weighted_qk_norm else None

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_cache,
                plan: dict[int, AttentionPlan]) -> torch.Tensor:
        # x: (num_tokens, hidden_size); plan: sliding window (0 = none) or ("chunk", size) -> this step's plan
        num_tokens = x.shape[0]
        q, k, v = self.project(x)
        if self.qk_norm == "projection":
            q = self.q_norm(q.reshape(num_tokens, -1)).view(num_tokens, self.num_heads, self.head_dim)
            k = self.k_norm(k.reshape(num_tokens, -1)).view(num_tokens, self.num_kv_heads, self.head_dim)
        elif self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)  # over head_dim, each head alone
        if self.rotary_emb is not None:
            q, k = self.rotary_emb(positions, q, k)
        if self.l2_qk_norm_eps is not None:
            q, k = l2_norm(q, self.l2_qk_norm_eps), l2_norm(k, self.l2_qk_norm_eps)
        if self.temperature is not None:
            q = (q * temperature_scales(positions, *self.temperature).view(-1, 1, 1)).to(q.dtype)
        k_cache = kv_cache.k_caches[self.layer_idx]  # (num_blocks, block_size, num_kv_heads, head_dim)
        v_cache = kv_cache.v_caches[self.layer_idx]
        self.kv_write(k, v, k_cache, v_cache, plan[self.plan_key].slot_mapping)
        if self.sinks is None:
            out = self.attn(q, k, v, k_cache, v_cache, plan[self.plan_key])  # (num_tokens, num_heads, head_dim)
        else:
            out = self.attn(q, k, v, k_cache, v_cache, plan[self.plan_key], self.sinks)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The Q, K and V projections of x: (num_heads | num_kv_heads, head_dim) per token."""
        num_tokens = x.shape[0]
        q = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        return q, k, v
