"""The paged decode attention kernel's cost a call: measured by running the kernel itself.

The cost model's attention stages (cost.py: ``attn_scores``, ``softmax``,
``attn_weighted_sum``, fused on this engine) are the roofline of reading each layer's K and V
once. At a chat's short contexts that is a few KB a layer (SmolLM2 at 40 tokens: 30 KB, ~1 us
at 30 GB/s), while the kernel's call costs ~8 us a layer there: it plans its work (the heads'
groups, the block table's blocks), then walks the blocks, bound by its own work (the softmax's
exps, the heads' dots) more than by the bytes. A decode step's ``attention`` row measured 4.2x
its roofline on SmolLM2 (5% of the step) and 3x on the 1.5B (1%).

So the probe runs the engine's own kernel (the exported C function the module path calls, with
the decode call's own attention behind it: drivers/decode_attention.c) on one query row of the
model's shape, one thread, at a one-block context and at ``LONG_CONTEXT`` tokens, best of
``ROUNDS`` rounds of ``CALLS`` calls, less the same call refused at its first check (the ctypes
call's own cost), and fits a fixed part a call and a part per context token; hot (the same
blocks every call) and cold (``"/cold"``: every call over blocks no call read before). A step
of decode rows is priced at layers x rows x (fixed + per token x the row's context), split over
the threads where the kernel splits, never below the roofline (``price_attention``).

Keys ``"HEADSxKV_HEADSxHEAD_DIM/DTYPE/BLOCK"``; (fixed, per-token) seconds in
``HardwareSpec.attention_s``, cached beside the probe as the sampler's are (``"attention_s"``;
a re-probe drops them, a busy machine's figures are used and not kept). Presets have none:
the roofline alone.
"""
from __future__ import annotations

import time
from dataclasses import replace

CALLS = 200
ROUNDS = 5
LONG_CONTEXT = 256  # the second context measured (tokens; a multiple of the block size)
COLD = "cold"  # the suffix of a key measured over blocks no call read before (measure_attention)
ATTENTION_STAGES = ("attn_scores", "softmax", "attn_weighted_sum")


def attention_key(num_heads: int, num_kv_heads: int, head_dim: int, dtype: str, block_size: int) -> str:
    return f"{num_heads}x{num_kv_heads}x{head_dim}/{dtype}/{block_size}"


def engine_attention_key(engine) -> str | None:
    """The key of the engine's decode attention calls, or None where its kernel is not the
    paged one (latent or linear attention layers: their own kinds keep the roofline)."""
    from inferpath.explain.layer_cost import priced_by_kind

    config = engine.model_config
    if priced_by_kind(config):
        return None
    dtype = str(engine.kv_cache.dtype).removeprefix("torch.")
    return attention_key(config.num_heads, config.num_kv_heads, config.head_dim, dtype, engine.kv_cache.block_size)


def measure_attention(key: str) -> tuple[float, float] | None:
    """(seconds of the paged decode kernel's fixed part a call, seconds per context token)
    on one thread (module doc), or None without the native kernel for that dtype. A key
    ending in ``"/cold"``: every call over blocks no call before it read, the cache's blocks
    passing ``probe_kernels.STREAM_LLC_MULTIPLE`` last-level caches (a decode step's K and V
    come after its weights streamed through the caches)."""
    import torch

    from inferpath.explain.probe_kernels import STREAM_LLC_MULTIPLE, llc_bytes
    from inferpath.kernels import build

    shape, dtype_name, block, *cold = key.split("/")
    heads, kv_heads, head_dim = (int(v) for v in shape.split("x"))
    dtype, block_size = getattr(torch, dtype_name), int(block)
    fn = build.native_paged_attention(dtype)
    if fn is None:
        return None
    per_call = LONG_CONTEXT // block_size  # blocks a long call reads
    block_bytes = 2 * block_size * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
    copies = max(1, STREAM_LLC_MULTIPLE * llc_bytes() // (per_call * block_bytes)) if cold == [COLD] else 1
    q = torch.randn(1, heads, head_dim).to(dtype)
    k_cache = torch.randn(copies * per_call, block_size, kv_heads, head_dim).to(dtype)
    v_cache = torch.randn(copies * per_call, block_size, kv_heads, head_dim).to(dtype)
    out = torch.empty_like(q)
    # a long call reads one copy's blocks; a short call one block (cold: the next one not read yet)
    tables = {LONG_CONTEXT: torch.arange(copies * per_call, dtype=torch.int64).reshape(copies, per_call),
              block_size: torch.arange(copies * per_call, dtype=torch.int64).reshape(copies * per_call, 1)}
    lens = {n: torch.tensor([n], dtype=torch.int64) for n in tables}

    def args(i: int, context: int, rows: int = 1) -> list:
        table = tables[context][i % tables[context].shape[0]]
        return [q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), table.data_ptr(), lens[context].data_ptr(),
                out.data_ptr(), rows, heads, kv_heads, head_dim, block_size, table.numel(), head_dim ** -0.5, 0, 1]

    def best(context: int, rows: int = 1) -> float:
        calls = [args(i, context, rows) for i in range(ROUNDS * CALLS)]
        fastest = float("inf")
        for r in range(ROUNDS):
            start = time.perf_counter()
            for call in calls[r * CALLS:(r + 1) * CALLS]:
                fn(*call)
            fastest = min(fastest, (time.perf_counter() - start) / CALLS)
        return fastest

    if fn(*args(0, block_size)) != 0 or fn(*args(0, LONG_CONTEXT)) != 0 or fn(*args(0, block_size, rows=0)) == 0:
        raise RuntimeError(f"the paged decode attention probe's calls did not behave as planned for {key}")
    empty, at_short, at_long = best(block_size, rows=0), best(block_size), best(LONG_CONTEXT)
    per_token = max(0.0, (at_long - at_short) / (LONG_CONTEXT - block_size))
    return max(0.0, at_short - empty - per_token * block_size), per_token


def with_attention_costs(hardware, keys, refresh: bool = False, cache_path=None, measure: bool = True):
    """``hardware`` with ``attention_s`` holding every key of ``keys`` (measured, or cached
    beside this machine's probe: probe.with_measured); a preset is returned as it is."""
    from inferpath.explain.probe import with_measured

    return with_measured(hardware, "attention_s", keys, measure_attention, refresh, cache_path, measure)


# decode rows x heads x head dim x context from which the kernel splits over the threads:
# drivers/decode.c's ATTENTION_PARALLEL_MIN_WORK (the native step), decode_attention.c's
# PARALLEL_MIN_WORK (the module path's call)
PARALLEL_MIN_WORK = {True: 1 << 16, False: 1 << 18}


def probed_keys(key: str | None) -> list[str]:
    """The key hot and cold (what a trace's steps may be priced at)."""
    return [key, f"{key}/{COLD}"] if key else []


def price_attention(stages: tuple, key: str | None, contexts: list[int], layers: int, heads_dims: int,
                    window: int | None, hardware, cold: bool, native: bool, threads: int) -> tuple:
    """``stages`` with the attention stages (``ATTENTION_STAGES``) priced at the kernel's
    measured cost where ``hardware`` has ``key`` (``cold``: its cold figure first) and every row
    of the step is a decode row (``contexts``: each row's context): per layer and row, the fixed
    part plus the per-token part over the context the row attends (its window), split over
    ``threads`` where the kernel splits (``PARALLEL_MIN_WORK``); the stages keep their bytes and
    FLOPs and share the time as their rooflines did, never below them. Else as they are."""
    rates = hardware.attention_s
    measured = ((cold and rates.get(f"{key}/{COLD}")) or rates.get(key)) if key else None
    if not measured or not contexts:
        return stages
    fixed, per_token = measured
    attended = [min(c, window) if window else c for c in contexts]
    split = threads if len(attended) * heads_dims * max(attended) >= PARALLEL_MIN_WORK[native] else 1
    seconds = layers * sum(fixed + per_token * c / split for c in attended)
    mine = [s for s in stages if s.name in ATTENTION_STAGES]
    roofline = sum(s.time_s for s in mine)
    if not mine or seconds <= roofline:
        return stages
    share = {id(s): s.time_s / roofline if roofline > 0 else 1 / len(mine) for s in mine}
    return tuple(replace(s, memory_time_s=seconds * share[id(s)]) if id(s) in share else s for s in stages)
