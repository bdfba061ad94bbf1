"""The attention plan of a step: which tokens attend how, decided once and shared by all layers.

``AttentionPlan`` is derived once per step from ``AttentionMetadata`` (host lists only, so
building it never waits on the device). It splits the flat batch into one batched group of
single-token queries (decodes: gather K/V through the block tables, one
``scaled_dot_product_attention`` call) and per-sequence prefill chunks (which may sit on top
of earlier context from chunked prefill or a prefix-cache hit). ``causal_mask`` is the
mask those chunks (and the reference) use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

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
