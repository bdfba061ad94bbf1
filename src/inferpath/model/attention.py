"""Causal attention over the paged KV cache, and a plain contiguous reference.

The only step where tokens see each other: for each new token, scores = q . k / sqrt(d)
against every cached key of its own sequence up to its own position, softmax, weighted
sum of the values. Grouped-query attention: query head h reads KV head
``h // (num_heads // num_kv_heads)``.

The modules read a step's ``AttentionPlan`` (attention_plan.py: built once per step and
shared by all layers): one batched group of single-token queries, and per-sequence prefill
chunks on top of earlier context.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from inferpath.model.attention_plan import AttentionPlan, DecodeGroup, PrefillChunk, causal_mask


class KVWrite(nn.Module):
    """Writes this step's K and V into the paged cache at ``slot_mapping``.

    A slot is ``block_id * block_size + offset``; the cache of shape
    (num_blocks, block_size, num_kv_heads, head_dim) is viewed as (num_slots, ...) rows.
    """

    def forward(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                slot_mapping: torch.Tensor) -> None:
        # k, v: (num_tokens, num_kv_heads, head_dim)
        num_kv_heads, head_dim = k_cache.shape[-2:]
        if k.dtype != k_cache.dtype:
            k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


class PagedAttention(nn.Module):
    """softmax(q k^T / sqrt(head_dim)) v over the cache, causal, grouped-query.

    Reads K/V of earlier tokens through the block tables (this step's K/V must already be
    written). ``sinks`` (num_heads,), gpt-oss: one learned logit per head joins each softmax's
    denominator and weighs no value. Returns (num_tokens, num_heads, head_dim).
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, plan: AttentionPlan, sinks: torch.Tensor | None = None) -> torch.Tensor:
        # q: (num_tokens, num_heads, head_dim); k, v: (num_tokens, num_kv_heads, head_dim)
        if k_cache.dtype != q.dtype:  # a bf16 cache beside float32 activations: every read of this step's
            k, v = as_cached(k, k_cache), as_cached(v, v_cache)  # K/V, from the cache or here, sees its values
        if plan.softcap or sinks is not None or plan.chunk_size:  # neither SDPA nor the native kernels do these
            return softcapped_attention(q, k, v, k_cache, v_cache, plan, sinks)
        decode = plan.decode
        if decode is not None and decode.token_rows is None:
            return self._decode(q, k_cache, v_cache, decode, plan.scale)
        if decode is None and len(plan.prefills) == 1:
            return self._prefill(q, k, v, k_cache, v_cache, plan.prefills[0], plan.scale)
        out = torch.empty_like(q)
        if decode is not None:
            rows = decode.token_rows
            out.index_copy_(0, rows, self._decode(q.index_select(0, rows), k_cache, v_cache, decode, plan.scale))
        for chunk in plan.prefills:
            rows = slice(chunk.token_start, chunk.token_start + chunk.query_len)
            out[rows] = self._prefill(q, k, v, k_cache, v_cache, chunk, plan.scale)
        return out

    @staticmethod
    def _decode(q, k_cache, v_cache, group: DecodeGroup, scale: float) -> torch.Tensor:
        if group.exact_lens is not None:
            return PagedAttention._decode_each(q, k_cache, v_cache, group, scale)
        num_seqs = q.shape[0]
        num_kv_heads, head_dim = k_cache.shape[-2:]
        context = group.blocks_per_seq * k_cache.shape[1]

        def gather(cache):  # -> (num_seqs, num_kv_heads, num_keys, head_dim)
            blocks = cache.index_select(0, group.block_ids).to(q.dtype)  # (num_seqs * blocks_per_seq, block_size, kvh, hd)
            return blocks.view(num_seqs, context, num_kv_heads, head_dim)[:, group.key_start:group.key_end].transpose(1, 2)

        # NOTE: a single query per sequence lets grouped-query attention run as plain
        # multi-head attention: the num_heads / num_kv_heads query heads sharing a KV head
        # become that KV head's query rows, so K/V are read once and never expanded.
        grouped_q = q.reshape(num_seqs, num_kv_heads, -1, head_dim)  # (num_seqs, kvh, group, hd)
        out = F.scaled_dot_product_attention(
            grouped_q, gather(k_cache), gather(v_cache), attn_mask=group.mask, scale=scale,
        )
        return out.reshape(q.shape)  # (num_seqs, num_heads, head_dim)

    @staticmethod
    def _decode_each(q, k_cache, v_cache, group: DecodeGroup, scale: float) -> torch.Tensor:
        """One SDPA call per row over exactly its keys: the same call for a token whatever
        else shares the step (batch-invariant plans)."""
        num_kv_heads, head_dim = k_cache.shape[-2:]
        block_size = k_cache.shape[1]
        window = group.sliding_window
        out = torch.empty_like(q)  # (num_rows, num_heads, head_dim)
        for row, length in enumerate(group.exact_lens):
            first = row * group.blocks_per_seq
            blocks = group.block_ids[first:first + -(-length // block_size)]
            start = max(0, length - window) if window else 0

            def gather(cache):  # -> (1, num_kv_heads, num_keys, head_dim)
                keys = cache.index_select(0, blocks).view(-1, num_kv_heads, head_dim)[start:length].to(q.dtype)
                return keys.transpose(0, 1).unsqueeze(0)

            grouped_q = q[row].reshape(1, num_kv_heads, -1, head_dim)  # (1, kvh, group, hd)
            attended = F.scaled_dot_product_attention(grouped_q, gather(k_cache), gather(v_cache), scale=scale)
            out[row] = attended.reshape(q.shape[1:])
        return out

    @staticmethod
    def _prefill(q, k, v, k_cache, v_cache, chunk: PrefillChunk, scale: float) -> torch.Tensor:
        rows = slice(chunk.token_start, chunk.token_start + chunk.query_len)
        if chunk.block_ids is None:  # no earlier context: this step's K/V are the whole context
            keys, values = k[rows], v[rows]  # (seq_len, num_kv_heads, head_dim)
        else:
            num_kv_heads, head_dim = k_cache.shape[-2:]
            keys = k_cache.index_select(0, chunk.block_ids).view(-1, num_kv_heads, head_dim)[: chunk.seq_len].to(q.dtype)
            values = v_cache.index_select(0, chunk.block_ids).view(-1, num_kv_heads, head_dim)[: chunk.seq_len].to(q.dtype)
        out = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1).unsqueeze(0),  # (1, num_heads, query_len, head_dim)
            keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0),
            attn_mask=chunk.mask, is_causal=chunk.is_causal, scale=scale, enable_gqa=True,
        )
        return out.squeeze(0).transpose(0, 1)  # (query_len, num_heads, head_dim)


def as_cached(t: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """``t`` (this step's K or V, in the activations' dtype) holding the values its cache of
    another dtype keeps (rounded to it, then widened back): EngineConfig.kv_cache_dtype."""
    return t.to(cache.dtype).to(t.dtype)


def softcapped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, plan: AttentionPlan, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``PagedAttention`` with Gemma 2's soft-capped scores, gpt-oss's sinks and/or Llama 4's
    attention chunks, written out: each decode row and each prefill chunk attends over exactly its own sequence's keys
    (so it is batch-invariant too). Returns (num_tokens, num_heads, head_dim)."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    block_size = k_cache.shape[1]

    def gather(cache, block_ids, length):  # -> (length, num_kv_heads, head_dim), in q's dtype
        return cache.index_select(0, block_ids).view(-1, num_kv_heads, head_dim)[:length].to(q.dtype)

    out = torch.empty_like(q)
    decode = plan.decode
    if decode is not None:
        rows = range(q.shape[0]) if decode.token_rows is None else decode.token_rows.tolist()
        lens = decode.exact_lens if decode.exact_lens is not None else decode.seq_lens.tolist()
        for i, (row, length) in enumerate(zip(rows, lens)):
            first = i * decode.blocks_per_seq
            blocks = decode.block_ids[first:first + -(-length // block_size)]
            mask = causal_mask(1, length, decode.sliding_window or None, q.device, plan.chunk_size)
            out[row] = capped_scores_attention(q[row:row + 1], gather(k_cache, blocks, length),
                                               gather(v_cache, blocks, length), mask, plan.scale, plan.softcap,
                                               sinks)[0]
    for chunk in plan.prefills:
        rows = slice(chunk.token_start, chunk.token_start + chunk.query_len)
        if chunk.block_ids is None:
            keys, values = k[rows], v[rows]  # (seq_len, num_kv_heads, head_dim)
        else:
            keys, values = gather(k_cache, chunk.block_ids, chunk.seq_len), gather(v_cache, chunk.block_ids, chunk.seq_len)
        mask = chunk.mask if chunk.mask is not None else causal_mask(chunk.query_len, chunk.seq_len, None, q.device)
        out[rows] = capped_scores_attention(q[rows], keys, values, mask, plan.scale, plan.softcap, sinks)
    return out


def capped_scores_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                            scale: float, softcap: float | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(mask(softcap * tanh(q k^T * scale / softcap))) v for one sequence, grouped-query;
    no tanh without ``softcap``; with ``sinks`` (num_heads,) each head's sink logit joins the
    softmax as one more key whose value is zero.

    q: (query_len, num_heads, head_dim); k, v: (seq_len, num_kv_heads, head_dim); mask:
    (query_len, seq_len) bool, True = attend. Scores in q's dtype and softmax in float32, in
    transformers' order. Returns (query_len, num_heads, head_dim).
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (seq_len, num_heads, head_dim)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # (num_heads, query_len, seq_len)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:  # (num_heads, query_len, seq_len + 1): the sink's column, then dropped
        sink = sinks.to(scores.dtype).view(-1, 1, 1).expand(-1, scores.shape[1], 1)
        probs = torch.cat((scores, sink), dim=-1).float().softmax(dim=-1)[..., :-1].to(q.dtype)
    else:
        probs = scores.float().softmax(dim=-1).to(q.dtype)
    return torch.einsum("hqk,khd->qhd", probs, v)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        sliding_window: int | None = None) -> torch.Tensor:
    """Plain-torch causal attention of one sequence over contiguous K/V (the test oracle).

    q: (query_len, num_heads, head_dim) -- the last query_len positions of the context;
    k, v: (seq_len, num_kv_heads, head_dim). Returns (query_len, num_heads, head_dim).
    """
    query_len, num_heads, head_dim = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)  # (seq_len, num_heads, head_dim)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / math.sqrt(head_dim)  # (heads, q, k)
    mask = causal_mask(query_len, seq_len, sliding_window, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)
