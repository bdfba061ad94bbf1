"""Paged attention against the plain contiguous reference, on mixed batches.

A batch mixes prefill chunks on top of earlier context (chunked prefill, prefix-cache
hits), fresh prefills and decodes, in any order, with shuffled non-contiguous block ids.
Each sequence's output must equal ``reference_attention`` over its own contiguous K/V.
"""

from __future__ import annotations

import random
import sys

import pytest
import torch

from inferpath.kernels import build as kernel_build
from inferpath.kernels import gemv_available, kernel_status
from inferpath.kernels.modules import CPUPagedAttention
from inferpath.model.attention import KVWrite, PagedAttention, reference_attention
from inferpath.model.attention_plan import build_attention_plan, causal_mask
from inferpath.model.metadata import AttentionMetadata

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 6, 2, 8, 4, 1600
# the levels that build the native prefill attention (avx2 and avxvnni: its 256-bit form)
PREFILL_ATTENTION_LEVELS = ("avx2", "avxvnni", "avx512")

# (context already cached, new tokens) per sequence, in batch order
BATCHES = {
    "mixed": [(7, 5), (9, 1), (0, 6), (2, 1), (16, 1), (3, 9)],
    "decodes-different-lengths": [(4, 1), (12, 1), (0, 1), (7, 1)],
    "decodes-same-length": [(6, 1), (6, 1), (6, 1)],
    "single-fresh-prefill": [(0, 11)],
    "single-chunk-on-context": [(13, 4)],
    # enough work for the native decode kernel to split over threads (PARALLEL_MIN_WORK)
    "long-decodes": [(3000, 1), (2600, 1), (5, 1)],
}


def run_batch(batch, sliding_window, seed=0, attention_cls=PagedAttention, dtype=torch.float32):
    """(paged output, reference output), both (num_tokens, num_heads, head_dim); the inputs
    rounded to ``dtype`` first, the reference computed on the rounded values."""
    gen = torch.Generator().manual_seed(seed)
    free = list(range(NUM_BLOCKS))
    random.Random(seed).shuffle(free)
    k_cache = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    tables, slots, new_q, new_k, new_v, expected = [], [], [], [], [], []
    for context_len, query_len in batch:
        seq_len = context_len + query_len
        blocks = [free.pop() for _ in range(-(-seq_len // BLOCK_SIZE))]
        tables.append(blocks)
        keys = torch.randn(seq_len, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype).float()
        values = torch.randn(seq_len, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype).float()
        queries = (torch.randn(query_len, NUM_HEADS, HEAD_DIM, generator=gen) * 2).to(dtype).float()
        seq_slots = [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(seq_len)]
        flat_k, flat_v = k_cache.view(-1, NUM_KV_HEADS, HEAD_DIM), v_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)
        flat_k[seq_slots[:context_len]] = keys[:context_len]  # earlier steps' K/V
        flat_v[seq_slots[:context_len]] = values[:context_len]
        slots += seq_slots[context_len:]
        new_q.append(queries)
        new_k.append(keys[context_len:])
        new_v.append(values[context_len:])
        expected.append(reference_attention(queries, keys, values, sliding_window))
    width = max(map(len, tables)) + 1
    query_lens = [q for _, q in batch]
    seq_lens = [c + q for c, q in batch]
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor(starts),
        seq_lens=torch.tensor(seq_lens), block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        query_lens=query_lens, seq_lens_list=seq_lens, block_size=BLOCK_SIZE,
    )
    q, k, v = (torch.cat(t).to(dtype) for t in (new_q, new_k, new_v))
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    plan = build_attention_plan(meta, HEAD_DIM, sliding_window)
    KVWrite()(k, v, k_cache, v_cache, plan.slot_mapping)
    out = attention_cls()(q, k, v, k_cache, v_cache, plan)
    return out, torch.cat(expected)


@pytest.mark.parametrize("sliding_window", [None, 5])
@pytest.mark.parametrize("name", list(BATCHES))
@torch.inference_mode()
def test_paged_attention_equals_contiguous_reference(name, sliding_window):
    out, expected = run_batch(BATCHES[name], sliding_window)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not gemv_available(torch.float32), reason=f"no native kernels here: {kernel_status()}")
@pytest.mark.parametrize("isa", kernel_build.LEVEL_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sliding_window", [None, 5])
@pytest.mark.parametrize("name", list(BATCHES))
@torch.inference_mode()
def test_native_paged_decode_attention_equals_contiguous_reference(name, sliding_window, dtype, isa, monkeypatch):
    """The decode group through the C kernel of each instruction-set level this CPU
    executes (keys read in place through the block tables), the prefill chunks through
    SDPA: the same outputs as the reference."""
    if not kernel_build.can_run(isa):
        pytest.skip(f"this CPU cannot execute the {isa} level (its best is {kernel_build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", isa)
    if not gemv_available(dtype):
        pytest.skip(kernel_status())
    out, expected = run_batch(BATCHES[name], sliding_window, attention_cls=CPUPagedAttention, dtype=dtype)
    assert out.shape == expected.shape and out.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    else:  # one bf16 rounding of the output (and SDPA's own, for the prefill rows)
        torch.testing.assert_close(out.float(), expected, rtol=2**-7, atol=2e-2)


@torch.inference_mode()
def test_native_decode_attention_leaves_what_it_cannot_hold_to_sdpa(monkeypatch):
    """A query group larger than the kernel's registers hold goes to PyTorch's path (and
    still equals the reference) instead of failing the step."""
    from inferpath.kernels import modules, ops

    monkeypatch.setattr(ops, "ATTENTION_MAX_GROUP", 2)  # these batches have groups of 3
    calls = []
    monkeypatch.setattr(modules, "run_paged_decode_attention", lambda *a: calls.append(a))
    out, expected = run_batch(BATCHES["decodes-different-lengths"], None, attention_cls=CPUPagedAttention)
    assert calls == []
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_causal_mask_offsets_and_window():
    mask = causal_mask(query_len=2, seq_len=5, sliding_window=None)
    assert mask.tolist() == [[True, True, True, True, False], [True] * 5]
    mask = causal_mask(query_len=2, seq_len=5, sliding_window=2)
    assert mask.tolist() == [[False, False, True, True, False], [False, False, False, True, True]]


def test_reference_attention_is_softmax_of_scaled_scores():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 4, generator=gen)
    k = torch.randn(3, 1, 4, generator=gen)
    v = torch.randn(3, 1, 4, generator=gen)
    out = reference_attention(q, k, v)
    for head in range(2):  # both query heads share the single KV head
        weights = torch.softmax(k[:, 0] @ q[0, head] / 2.0, dim=0)  # sqrt(head_dim) = 2
        torch.testing.assert_close(out[0, head], weights @ v[:, 0])


@pytest.mark.skipif(not gemv_available(torch.float32), reason=f"no native kernels here: {kernel_status()}")
@pytest.mark.parametrize("isa", kernel_build.LEVEL_NAMES)
@pytest.mark.parametrize("head_dim", [64, 80])
@torch.inference_mode()
def test_native_decode_attention_splits_long_contexts_at_real_head_sizes(head_dim, isa, monkeypatch):
    """Real head sizes (SmolLM2's 64; 80, not a multiple of the 16-lane vectors) with SmolLM2's
    query groups of 3, over contexts of several key parts (quant/attention_parts.h: 128 keys
    each, combined), a part's last keys short of a 16-key group: the reference's outputs."""
    if not kernel_build.can_run(isa):
        pytest.skip(f"this CPU cannot execute the {isa} level (its best is {kernel_build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", isa)
    here = sys.modules[__name__]
    for name, value in (("HEAD_DIM", head_dim), ("NUM_HEADS", 9), ("NUM_KV_HEADS", 3), ("BLOCK_SIZE", 16),
                        ("NUM_BLOCKS", 200)):
        monkeypatch.setattr(here, name, value)
    out, expected = here.run_batch([(700, 1), (129, 1), (255, 1), (40, 1)], None, attention_cls=CPUPagedAttention)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not gemv_available(torch.float32), reason=f"no native kernels here: {kernel_status()}")
@pytest.mark.parametrize("isa", ["avx2", "avxvnni", "avx512"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim,kv_heads,group", [(32, 1, 16), (64, 3, 3), (128, 2, 6), (128, 1, 7), (64, 2, 8),
                                                     (32, 4, 1)])
@torch.inference_mode()
def test_fixed_head_size_decode_attention_gives_the_general_kernels_bits(head_dim, kv_heads, group, dtype, isa,
                                                                         monkeypatch):
    """Head sizes 32/64/128 take part kernels with the head size a constant and the query
    heads several at a time (avx2: up to 6, avx512: up to 8); the general part serves any
    other size. The same heads padded with 16 zeros (a size the general part takes) give the
    same bits: the fixed parts compute every value in the general part's order. Contexts of
    1-3 parts of 128 keys, a part's last keys short of a vector's worth."""
    from inferpath.kernels.ops import run_paged_decode_attention

    if not kernel_build.can_run(isa):
        pytest.skip(f"this CPU cannot execute the {isa} level (its best is {kernel_build.cpu_level()})")
    gen = torch.Generator().manual_seed(head_dim * 100 + group)
    lens, block_size = [300, 129, 1, 45, 17], 16
    blocks = max(-(-n // block_size) for n in lens)
    num_blocks = blocks * len(lens) + 2
    tables = torch.randperm(num_blocks, generator=gen)[: blocks * len(lens)].view(len(lens), blocks).contiguous()
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    q = (torch.randn(len(lens), kv_heads * group, head_dim, generator=gen) * 2).to(dtype)
    seq_lens, scale = torch.tensor(lens), head_dim ** -0.5
    fn = kernel_build.native_paged_attention(dtype, isa)
    pad = lambda t: torch.nn.functional.pad(t, (0, 16)).contiguous()  # noqa: E731
    for threads in (1, 2):
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
        fixed = run_paged_decode_attention(fn, q, k, v, tables, seq_lens, scale, 0)
        general = run_paged_decode_attention(fn, pad(q), pad(k), pad(v), tables, seq_lens, scale, 0)[..., :head_dim]
        assert torch.equal(fixed, general), f"{threads} threads: max |diff| {(fixed - general).abs().max()}"
        expected = torch.cat([reference_attention(q[i:i + 1], k[tables[i]].flatten(0, 1)[:n], v[tables[i]].flatten(0, 1)[:n])
                              for i, n in enumerate(lens)])
        torch.testing.assert_close(fixed.float(), expected.float(), rtol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                                   atol=2e-2 if dtype == torch.bfloat16 else 1e-5)


@pytest.mark.parametrize("isa", kernel_build.LEVEL_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim", [(77, 9, 3, 64), (40, 4, 4, 80), (33, 16, 1, 32),
                                                            (200, 8, 2, 128), (1, 6, 2, 8)])
@torch.inference_mode()
def test_native_prefill_attention_equals_causal_sdpa(tokens, heads, kv_heads, head_dim, dtype, isa, monkeypatch):
    """A prompt chunk over its own keys through the native kernel (avx512/prefill_attention.c
    at the avx512 level, avx2/prefill_attention.c at avx2 and avxvnni; at the generic level
    PyTorch's SDPA runs, and there is no kernel to call): q, k and v as the views of one
    fused projection (strided token rows), grouped-query heads, head sizes whole and partial
    vectors: the causal attention PyTorch computes in float32."""
    from inferpath.kernels import ops

    if not kernel_build.can_run(isa):
        pytest.skip(f"this CPU cannot execute the {isa} level (its best is {kernel_build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", isa)
    fn = kernel_build.native_prefill_attention(dtype)
    if isa == "generic":
        assert fn is None
        return
    assert fn is not None, kernel_status()
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))
    out = ops.run_prefill_attention(fn, q, k, v, head_dim ** -0.5)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(t.float().transpose(0, 1).unsqueeze(0) for t in (q, k, v)), is_causal=True, enable_gqa=True,
        scale=head_dim ** -0.5).squeeze(0).transpose(0, 1)
    assert out.dtype == dtype and out.shape == (tokens, heads, head_dim)
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    else:  # one bf16 rounding of the output
        torch.testing.assert_close(out.float(), expected, rtol=2**-7, atol=2e-2)


@pytest.mark.parametrize("isa", PREFILL_ATTENTION_LEVELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@torch.inference_mode()
def test_native_prefill_attention_rescales_as_later_keys_outgrow_the_first(dtype, isa, monkeypatch):
    """Keys whose scale grows along the prompt (and a first key far above the rest for the
    last heads), so that a query's top score keeps rising block after block and the
    kernel must rescale its running sums, or keeps one early top and must not: the
    causal attention computed in float64 (PyTorch's float32 SDPA is 2e-5 off it here)."""
    from inferpath.kernels import ops

    if not kernel_build.can_run(isa):
        pytest.skip(f"this CPU cannot execute the {isa} level (its best is {kernel_build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", isa)
    assert kernel_build.native_prefill_attention(dtype) is not None, kernel_status()
    tokens, heads, kv_heads, head_dim = 300, 6, 2, 64
    gen = torch.Generator().manual_seed(3)
    ramp = (1 + torch.arange(tokens) / 16).view(tokens, 1, 1)  # late scores up to ~20x the first
    q = torch.randn(tokens, heads, head_dim, generator=gen).to(dtype)
    k = (torch.randn(tokens, kv_heads, head_dim, generator=gen) * ramp)
    k[0, 1] = q[:, 3:].float().mean(dim=(0, 1)) * 8  # the last heads' first score stays on top
    k, v = k.to(dtype), torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype)
    out = ops.run_prefill_attention(kernel_build.native_prefill_attention(dtype), q, k, v, head_dim ** -0.5)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(t.double().transpose(0, 1).unsqueeze(0) for t in (q, k, v)), is_causal=True, enable_gqa=True,
        scale=head_dim ** -0.5).squeeze(0).transpose(0, 1)
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(out.double(), expected, rtol=2**-7, atol=2e-2)


@pytest.mark.parametrize("isa", PREFILL_ATTENTION_LEVELS)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (12, 2, 128)], ids=["smollm2", "qwen2.5-1.5b"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ["mixed", "single-chunk-on-context", "single-fresh-prefill"])
@torch.inference_mode()
def test_prompt_chunks_take_the_native_prefill_attention_with_or_without_context(name, dtype, heads, kv_heads,
                                                                                 head_dim, isa, monkeypatch):
    """At the levels that build the native prefill attention (avx2 and avxvnni: the 256-bit
    kernel; avx512) every prompt chunk without a sliding window runs it, a chunk on cached
    context reading its keys through the block table (real head sizes: SmolLM2's groups of
    3 over 64 dims, Qwen2.5-1.5B's groups of 6 over 128, each size its own compiled loop):
    the reference's outputs."""
    from inferpath.kernels import modules

    if not kernel_build.can_run(isa):
        pytest.skip(f"this CPU cannot execute the {isa} level (its best is {kernel_build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", isa)
    assert kernel_build.native_prefill_attention(dtype) is not None, kernel_status()
    here = sys.modules[__name__]
    for field, value in (("HEAD_DIM", head_dim), ("NUM_HEADS", heads), ("NUM_KV_HEADS", kv_heads), ("BLOCK_SIZE", 16),
                         ("NUM_BLOCKS", 64)):
        monkeypatch.setattr(here, field, value)
    calls = []
    native = modules.run_prefill_attention
    monkeypatch.setattr(modules, "run_prefill_attention", lambda *a, **k: calls.append(len(a)) or native(*a, **k))
    batch = [(context * 7, query * 5) for context, query in BATCHES[name]]
    out, expected = run_batch(batch, None, attention_cls=CPUPagedAttention, dtype=dtype)
    assert len(calls) == sum(1 for _, q in batch if q > 1)
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(out.float(), expected, rtol=2**-7, atol=2e-2)
