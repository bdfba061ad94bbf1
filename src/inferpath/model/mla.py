"""Multi-head latent attention (MLA, DeepSeek-V2/V3) over a paged cache of latents.

Per token the layer caches one normalised latent of ``kv_lora_rank`` (r) values and one
RoPE key of ``qk_rope_head_dim`` (p) values shared by every head: r + p values a layer
instead of 2 x heads x head_dim. Keys and values of head h are up-projections of the latent,
``k_nope_h = W_UK_h c`` (qk_nope_head_dim = n rows) and ``v_h = W_UV_h c`` (v_head_dim = v
rows); ``kv_b_proj`` holds both, per head [W_UK_h; W_UV_h].

    q_a_proj -> q_a_layernorm -> q_b_proj (or q_proj)   q: (T, H, n + p) = [q_nope, q_rot]
    kv_a_proj_with_mqa -> [latent (r), k_rot (p)];  kv_a_layernorm(latent)
    rotary_emb(q_rot, k_rot);  latent_write: [latent, k_rot] into the cache at the slots
    attn: decode rows absorbed, prefill chunks expanded  -> (T, H, v);  o_proj

Decode (one new token a sequence) runs the absorbed form: ``q_nope . W_UK_h c`` equals
``(W_UK_h^T q_nope) . c``, so each head's query is folded into latent space (r values),
scored against the cached latents and RoPE keys directly, the probabilities sum the
latents, and W_UV_h is applied once to that sum: the cache is read once for all heads and
never expanded. Prefill chunks expand every latent of their context through kv_b_proj and
run ordinary multi-head attention (cheaper when many queries share the keys). The two are
the same function (tests check it to float tolerance).

DeepSeek's RoPE dims are interleaved pairs (``rope_interleave``, transformers' default):
they are de-interleaved to the rotate-half layout before rotation, as transformers does.
The softmax scale is (n + p) ** -0.5, times mscale(factor, mscale_all_dim) ** 2 under YaRN.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from inferpath.config import ModelConfig
from inferpath.model.attention_plan import AttentionPlan, DecodeGroup, PrefillChunk
from inferpath.model.layers import RMSNorm
from inferpath.model.rope import RopeTable, RotaryEmbedding


def mla_rope_config(config: ModelConfig) -> ModelConfig:
    """The config RoPE sees: MLA rotates only the qk_rope_head_dim part of each head, a
    partial rotary (Qwen3-Next) the first head_dim x partial_rotary_factor."""
    if config.is_mla:
        return replace(config, head_dim=config.qk_rope_head_dim)
    if config.partial_rotary_factor != 1.0:
        return replace(config, head_dim=round(config.head_dim * config.partial_rotary_factor))
    return config


def mla_softmax_scale(config: ModelConfig) -> float:
    """(n + p) ** -0.5, times DeepSeek's YaRN mscale(factor, mscale_all_dim) squared."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    scaling = config.rope_scaling_dict or {}
    factor, m_all = float(scaling.get("factor", 1.0)), scaling.get("mscale_all_dim")
    if m_all and factor > 1:
        mscale = 0.1 * float(m_all) * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """(..., p) pairs (x0, x1), (x2, x3), ... -> [x0, x2, ..., x1, x3, ...] (rotate-half layout)."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


class LatentWrite(nn.Module):
    """Writes each new token's [latent, k_rot] (r + p values) at its slot of the layer's cache
    (num_blocks, block_size, 1, r + p)."""

    def forward(self, entry: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        # entry: (num_tokens, r + p)
        cache.view(-1, cache.shape[-1]).index_copy_(0, slot_mapping, entry.to(cache.dtype))


class LatentAttention(nn.Module):
    """Attention of one MLA layer given this step's queries and latents (module doc).

    ``absorb_decode`` False runs decode rows expanded too (the second path the tests compare)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.kv_lora_rank = config.num_heads, config.kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.scale = mla_softmax_scale(config)
        self.absorb_decode = True

    def forward(self, q_nope, q_rot, latent, k_rot, cache, plan: AttentionPlan, kv_b_proj: nn.Linear) -> torch.Tensor:
        # q_nope: (T, H, n); q_rot: (T, H, p); latent: (T, r); k_rot: (T, p); cache: (blocks, bs, 1, r + p)
        out = q_nope.new_empty(q_nope.shape[0], self.num_heads, self.v_dim)  # (T, H, v)
        decode = plan.decode
        if decode is not None:
            rows = decode.token_rows
            qn, qr = (q_nope, q_rot) if rows is None else (q_nope.index_select(0, rows), q_rot.index_select(0, rows))
            attended = self._decode(qn, qr, cache, decode, kv_b_proj)
            if rows is None:
                out = attended
            else:
                out.index_copy_(0, rows, attended)
        for chunk in plan.prefills:
            rows = slice(chunk.token_start, chunk.token_start + chunk.query_len)
            out[rows] = self._prefill(q_nope[rows], q_rot[rows], latent[rows], k_rot[rows], cache, chunk, kv_b_proj)
        return out

    def _split_kv_b(self, kv_b_proj: nn.Linear, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK (H, n, r), W_UV (H, v, r)) from kv_b_proj's weight (H * (n + v), r)."""
        weight = getattr(kv_b_proj, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise TypeError("MLA's absorbed decode needs kv_b_proj's weight as a float matrix; "
                            f"{type(kv_b_proj).__name__} has none (quantized kv_b_proj is not supported)")
        per_head = weight.to(dtype).view(self.num_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        return per_head[:, :self.nope_dim], per_head[:, self.nope_dim:]

    def _decode(self, q_nope, q_rot, cache, group: DecodeGroup, kv_b_proj) -> torch.Tensor:
        """One query per sequence: absorbed (or expanded) attention over the gathered latents."""
        num_seqs, width = q_nope.shape[0], cache.shape[-1]
        context = group.blocks_per_seq * cache.shape[1]
        entries = cache.index_select(0, group.block_ids).view(num_seqs, context, width)  # (S, ctx, r + p)
        if group.exact_lens is not None:  # batch-invariant: each row over exactly its keys
            return torch.cat([self._attend_latents(q_nope[i:i + 1], q_rot[i:i + 1], entries[i:i + 1, :n], None,
                                                   kv_b_proj) for i, n in enumerate(group.exact_lens)])
        entries = entries[:, group.key_start:group.key_end]
        return self._attend_latents(q_nope, q_rot, entries, group.mask, kv_b_proj)

    def _attend_latents(self, q_nope, q_rot, entries, mask, kv_b_proj) -> torch.Tensor:
        # q_nope: (S, H, n); q_rot: (S, H, p); entries: (S, K, r + p); mask: (S, 1, 1, K) or None
        if not self.absorb_decode:
            return self._expanded(q_nope.unsqueeze(2), q_rot.unsqueeze(2), entries, mask, False, kv_b_proj).squeeze(2)
        w_uk, w_uv = self._split_kv_b(kv_b_proj, q_nope.dtype)
        q_latent = torch.einsum("shn,hnr->shr", q_nope, w_uk)  # (S, H, r): W_UK folded into the query
        query = torch.cat((q_latent, q_rot), dim=-1).unsqueeze(1)  # (S, 1, H, r + p): one shared KV head
        keys = entries.unsqueeze(1)  # (S, 1, K, r + p)
        values = entries[..., :self.kv_lora_rank].unsqueeze(1)  # (S, 1, K, r): the latents themselves
        summed = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=self.scale)
        return torch.einsum("shr,hvr->shv", summed.squeeze(1), w_uv)  # (S, H, v): W_UV after the sum

    def _expanded(self, q_nope, q_rot, entries, mask, is_causal, kv_b_proj) -> torch.Tensor:
        """Ordinary attention on up-projected keys and values.

        q_nope: (S, H, Q, n); q_rot: (S, H, Q, p); entries: (S, K, r + p) -> (S, H, Q, v)."""
        num_seqs, num_keys = entries.shape[:2]
        latent, k_rot = entries[..., :self.kv_lora_rank], entries[..., self.kv_lora_rank:]
        kv = kv_b_proj(latent.reshape(-1, self.kv_lora_rank).to(q_nope.dtype))  # (S * K, H * (n + v))
        kv = kv.view(num_seqs, num_keys, self.num_heads, self.nope_dim + self.v_dim).transpose(1, 2)
        k_nope, values = kv.split((self.nope_dim, self.v_dim), dim=-1)  # (S, H, K, n), (S, H, K, v)
        keys = torch.cat((k_nope, k_rot.unsqueeze(1).expand(-1, self.num_heads, -1, -1).to(k_nope.dtype)), dim=-1)
        query = torch.cat((q_nope, q_rot), dim=-1)  # (S, H, Q, n + p)
        return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, is_causal=is_causal,
                                              scale=self.scale)

    def _prefill(self, q_nope, q_rot, latent, k_rot, cache, chunk: PrefillChunk, kv_b_proj) -> torch.Tensor:
        if chunk.block_ids is None:  # no earlier context: this step's latents are all the keys
            entries = torch.cat((latent, k_rot), dim=-1)  # (seq_len, r + p)
        else:
            entries = cache.index_select(0, chunk.block_ids).view(-1, cache.shape[-1])[: chunk.seq_len]
        out = self._expanded(q_nope.transpose(0, 1).unsqueeze(0), q_rot.transpose(0, 1).unsqueeze(0),
                             entries.unsqueeze(0), chunk.mask, chunk.is_causal, kv_b_proj)  # (1, H, Q, v)
        return out.squeeze(0).transpose(0, 1)  # (query_len, H, v)


class MLASelfAttention(nn.Module):
    """The attention block of an MLA layer under Hugging Face's names (module doc)."""

    def __init__(self, config: ModelConfig, layer_idx: int, rope_table: RopeTable) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_heads
        self.nope_dim, self.rope_dim = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.rope_interleave = config.rope_interleave
        h, q_width = config.hidden_size, config.num_heads * (config.qk_nope_head_dim + config.qk_rope_head_dim)
        if config.q_lora_rank:
            self.q_a_proj = nn.Linear(h, config.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, 1e-6)  # transformers' fixed eps for these two
            self.q_b_proj = nn.Linear(config.q_lora_rank, q_width, bias=False)
        else:
            self.q_proj = nn.Linear(h, q_width, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, config.kv_lora_rank + config.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank, 1e-6)
        kv_width = config.num_heads * (config.qk_nope_head_dim + config.v_head_dim)
        self.kv_b_proj = nn.Linear(config.kv_lora_rank, kv_width, bias=False)
        self.rotary_emb = RotaryEmbedding(rope_table)
        self.latent_write = LatentWrite()
        self.attn = LatentAttention(config)
        self.o_proj = nn.Linear(config.num_heads * config.v_head_dim, h, bias=False)
        self.q_lora = bool(config.q_lora_rank)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_cache,
                plan: dict[int, AttentionPlan]) -> torch.Tensor:
        # x: (num_tokens, hidden_size)
        num_tokens = x.shape[0]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora else self.q_proj(x)
        q = q.view(num_tokens, self.num_heads, self.nope_dim + self.rope_dim)
        q_nope, q_rot = q.split((self.nope_dim, self.rope_dim), dim=-1)  # (T, H, n), (T, H, p)
        latent, k_rot = self.kv_a_proj_with_mqa(x).split((self.kv_lora_rank, self.rope_dim), dim=-1)
        latent = self.kv_a_layernorm(latent.contiguous())  # (T, r)
        if self.rope_interleave:
            q_rot, k_rot = deinterleave(q_rot), deinterleave(k_rot)
        q_rot, k_rot = self.rotary_emb(positions, q_rot.contiguous(), k_rot.contiguous().unsqueeze(1))
        k_rot = k_rot.squeeze(1)  # (T, p), shared by the heads
        cache = kv_cache.k_caches[self.layer_idx]  # (num_blocks, block_size, 1, r + p): latents
        step = plan[0]
        self.latent_write(torch.cat((latent, k_rot), dim=-1), cache, step.slot_mapping)
        out = self.attn(q_nope, q_rot, latent, k_rot, cache.squeeze(2), step, self.kv_b_proj)  # (T, H, v)
        return self.o_proj(out.reshape(num_tokens, -1))
