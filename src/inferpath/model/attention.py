"""Causal attention over the paged KV cache, and a plain contiguous reference.

The only step where tokens see each other: for each new token, scores = q . k / sqrt(d)
against every cached key of its own sequence up to its own position, softmax, weighted
sum of the values. Grouped-query attention: query head h reads KV head
``h // (num_heads // num_kv_heads)``.

``AttentionPlan`` is derived once per step from ``AttentionMetadata`` (host lists only, so
building it never waits on the device) and shared by all layers. It splits the flat batch
into one batched group of single-token queries (decodes: gather K/V through the block
tables, one ``scaled_dot_product_attention`` call) and per-sequence prefill chunks (which
may sit on top of earlier context from chunked prefill or a prefix-cache hit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from inferpath.model.metadata import AttentionMetadata


@dataclass
class DecodeGroup:
    """The sequences of a step whose query is one token, attended in one batched call."""

    token_rows: torch.Tensor | None  # (num_decodes,) rows of the flat batch; None = all rows
    block_ids: torch.Tensor  # (num_decodes * blocks_per_seq,) blocks to gather, row-major
    blocks_per_seq: int
    key_start: int  # keys [key_start, key_end) of the gathered context are read
    key_end: int
    mask: torch.Tensor | None  # (num_decodes, 1, 1, key_end - key_start) bool; None = all
    seq_lens: torch.Tensor  # (num_decodes,) context length of each, this step's token included
    sliding_window: int  # 0 = none; else each sequence reads its last sliding_window keys
    # batch-invariant plans: the host copy of seq_lens; each row then attends over exactly
    # its own keys (no padding, no mask), so its sums never depend on the other rows
    exact_lens: list[int] | None = None


@dataclass
class PrefillChunk:
    """One sequence's chunk of ``query_len`` > 1 new tokens on top of ``context_len`` cached."""

    token_start: int
    query_len: int
    seq_len: int
    block_ids: torch.Tensor | None  # (blocks,) to gather; None: no earlier context, use new K/V
    mask: torch.Tensor | None  # (query_len, seq_len) bool, True = attend; None with is_causal
    is_causal: bool
    windowed: bool = False  # a sliding window cuts its keys (the mask says which)


@dataclass
class AttentionPlan:
    """Everything attention needs for one step, built once and read by every layer."""

    slot_mapping: torch.Tensor  # (num_tokens,)
    decode: DecodeGroup | None
    prefills: list[PrefillChunk]
    scale: float
    softcap: float | None = None  # Gemma 2: scores -> softcap * tanh(scores / softcap)
    # Llama 4's chunked layers: a key is seen only from its query's own chunk of this many
    # positions (0 = none); masks written out (``softcapped_attention``)
    chunk_size: int = 0


def build_attention_plan(meta: AttentionMetadata, head_dim: int, sliding_window: int | None,
                         batch_invariant: bool = False, scale: float | None = None,
                         softcap: float | None = None, chunk_size: int = 0) -> AttentionPlan:
    """Split the flat batch into a decode group and prefill chunks, without host syncs.

    With ``batch_invariant`` every token, prefill or decode, is its own row of one exact
    decode group (``per_token_plan``). ``scale`` multiplies q . k (default head_dim ** -0.5);
    ``softcap`` squashes the scores (Gemma 2); ``chunk_size`` confines each query to its
    chunk of positions (Llama 4), its prefill masks built here and decode masks per row.
    """
    scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    if batch_invariant:
        return replace(per_token_plan(meta, scale, sliding_window), softcap=softcap, chunk_size=chunk_size)
    block_size = meta.block_size
    window = sliding_window or 0
    token_starts = [0]
    for query_len in meta.query_lens:
        token_starts.append(token_starts[-1] + query_len)
    decode_seqs = [i for i, q in enumerate(meta.query_lens) if q == 1]
    device = meta.block_tables.device

    decode = None
    if decode_seqs:
        all_decode = len(decode_seqs) == meta.num_seqs
        decode_lens = [meta.seq_lens_list[i] for i in decode_seqs]
        max_len = max(decode_lens)
        blocks_per_seq = -(-max_len // block_size)
        if all_decode:
            token_rows, tables, seq_lens = None, meta.block_tables, meta.seq_lens
        else:
            index = torch.tensor(decode_seqs, dtype=torch.long, device=device)
            token_rows = torch.tensor([token_starts[i] for i in decode_seqs], dtype=torch.long, device=device)
            tables, seq_lens = meta.block_tables.index_select(0, index), meta.seq_lens.index_select(0, index)
        block_ids = tables[:, :blocks_per_seq].reshape(-1)
        if min(decode_lens) == max_len:  # one length: slice the keys, no mask needed
            key_start = max(0, max_len - window) if window else 0
            mask = None
        else:
            key_start = 0
            keys = torch.arange(max_len, device=device)  # (max_len,)
            lens = seq_lens.view(-1, 1)  # (num_decodes, 1)
            mask = keys < lens
            if window:
                mask &= keys >= lens - window
            mask = mask.view(len(decode_seqs), 1, 1, max_len)
        decode = DecodeGroup(token_rows, block_ids, blocks_per_seq, key_start, max_len, mask,
                             seq_lens, window)

    prefills = []
    for i, query_len in enumerate(meta.query_lens):
        if query_len == 1:
            continue
        seq_len = meta.seq_lens_list[i]
        context_len = seq_len - query_len
        block_ids = None
        if context_len > 0:
            block_ids = meta.block_tables[i, : -(-seq_len // block_size)]
        needs_window = bool(window) and seq_len > window
        mask = None
        if context_len > 0 or needs_window or chunk_size:
            mask = causal_mask(query_len, seq_len, window, device, chunk_size)
        prefills.append(PrefillChunk(token_starts[i], query_len, seq_len, block_ids, mask, mask is None, needs_window))
    return AttentionPlan(meta.slot_mapping, decode, prefills, scale, softcap, chunk_size)


def per_token_plan(meta: AttentionMetadata, scale: float, sliding_window: int | None) -> AttentionPlan:
    """Every token as a one-query "sequence" over its own context, keys 0..position.

    NOTE: this is what makes a token's attention independent of the step it runs in:
    alone or batched, prompt row or decode, before or after a prefix hit or preemption, a
    token at position p reads exactly keys 0..p (the last ``sliding_window`` of them) of
    its sequence, in the same order, through one code path. Its K/V are already in the
    cache (written before attention). The cost: prompt rows read the cache like decodes.
    """
    lens: list[int] = []  # (num_tokens,) context length of each token: its position + 1
    for query_len, seq_len in zip(meta.query_lens, meta.seq_lens_list):
        lens.extend(range(seq_len - query_len + 1, seq_len + 1))
    device = meta.block_tables.device
    seq_of_token = torch.repeat_interleave(torch.arange(meta.num_seqs, device=device),
                                           torch.tensor(meta.query_lens, device=device))
    max_len = max(lens)
    blocks_per_seq = -(-max_len // meta.block_size)
    tables = meta.block_tables.index_select(0, seq_of_token)[:, :blocks_per_seq]  # (num_tokens, blocks)
    decode = DecodeGroup(None, tables.reshape(-1), blocks_per_seq, 0, max_len, None,
                         torch.tensor(lens, device=device), sliding_window or 0, exact_lens=lens)
    return AttentionPlan(meta.slot_mapping, decode, [], scale)


def causal_mask(query_len: int, seq_len: int, sliding_window: int | None, device=None,
                chunk_size: int = 0) -> torch.Tensor:
    """(query_len, seq_len) bool: query i (absolute position seq_len - query_len + i) sees key j
    iff j <= its position and, with a sliding window w, position - j < w; with a chunk size c,
    j // c == position // c."""
    positions = torch.arange(seq_len - query_len, seq_len, device=device).view(-1, 1)
    keys = torch.arange(seq_len, device=device).view(1, -1)
    mask = keys <= positions
    if sliding_window:
        mask &= keys > positions - sliding_window
    if chunk_size:
        mask &= keys // chunk_size == positions // chunk_size
    return mask


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
            blocks = cache.index_select(0, group.block_ids)  # (num_seqs * blocks_per_seq, block_size, kvh, hd)
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
                keys = cache.index_select(0, blocks).view(-1, num_kv_heads, head_dim)[start:length]
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
            keys = k_cache.index_select(0, chunk.block_ids).view(-1, num_kv_heads, head_dim)[: chunk.seq_len]
            values = v_cache.index_select(0, chunk.block_ids).view(-1, num_kv_heads, head_dim)[: chunk.seq_len]
        out = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1).unsqueeze(0),  # (1, num_heads, query_len, head_dim)
            keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0),
            attn_mask=chunk.mask, is_causal=chunk.is_causal, scale=scale, enable_gqa=True,
        )
        return out.squeeze(0).transpose(0, 1)  # (query_len, num_heads, head_dim)


def softcapped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, plan: AttentionPlan, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """``PagedAttention`` with Gemma 2's soft-capped scores, gpt-oss's sinks and/or Llama 4's
    attention chunks, written out: each decode row and each prefill chunk attends over exactly its own sequence's keys
    (so it is batch-invariant too). Returns (num_tokens, num_heads, head_dim)."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    block_size = k_cache.shape[1]

    def gather(cache, block_ids, length):  # -> (length, num_kv_heads, head_dim)
        return cache.index_select(0, block_ids).view(-1, num_kv_heads, head_dim)[:length]

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
