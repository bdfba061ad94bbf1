"""Engine builder: everything decided once before the loop runs.

Loading the checkpoint and tokenizer, building the model, applying the CPU kernels or
tensor parallelism, sizing the KV cache and choosing the sampler's argmax live here, so
that the loop (engine/llm_engine.py) imports neither ``kernels/`` nor ``parallel/`` and
reads as schedule -> execute -> update.
"""

from __future__ import annotations

import contextlib
import gc

import torch

from inferpath.cache.kv import KVCache
from inferpath.config import ConfigError, EngineConfig, ModelConfig
from inferpath.sampling.sampler import Sampler


def build_kv_cache(model_config: ModelConfig, engine_config: EngineConfig, dtype: torch.dtype) -> KVCache:
    """The KV cache: ``num_kv_blocks`` blocks, or as many as ``kv_cache_memory_bytes`` holds,
    in ``dtype`` (the weight plan's ``kv_dtype``: engine/weight_plan.py).

    With tensor parallelism each rank caches num_kv_heads / N heads of every token.
    """
    from inferpath.parallel.tp import shard_config

    if engine_config.kv_cache_dtype != "auto":
        kind = ("multi-head latent attention" if model_config.is_mla else
                "linear-attention layers" if model_config.num_linear_layers else None)
        if kind:
            raise ConfigError(f"kv_cache_dtype={engine_config.kv_cache_dtype!r} is not implemented for "
                              f"{kind} ({model_config.name}); use auto")
    bs = engine_config.block_size
    cache_config = shard_config(model_config, engine_config.tensor_parallel_size)
    num_blocks = engine_config.num_kv_blocks or KVCache.num_blocks_for_budget(
        cache_config, bs, dtype, engine_config.kv_cache_memory_bytes)
    # linear-attention layers: one state slot per sequence that can run at once
    return KVCache(cache_config, num_blocks, bs, dtype, num_state_slots=engine_config.max_num_seqs)


def build_sampler(engine_config: EngineConfig) -> Sampler:
    """The sampler; greedy rows use the native argmax when the CPU kernels are on."""
    argmax = None
    if engine_config.cpu_kernels:
        from inferpath.kernels import argmax_rows as argmax
    return Sampler(engine_config.seed, argmax=argmax)


def build_engine(model: str, engine_config: EngineConfig | None = None, progress: bool = False):
    """Load an alias (pulled on first use), a .gguf file or a Hugging Face directory and
    return an LLMEngine over it."""
    from inferpath.engine.llm_engine import LLMEngine
    from inferpath.engine.load import build_for_engine, load_weights
    from inferpath.models import resolve_model, served_model_name
    from inferpath.threads import configure_threads
    from inferpath.tokenizer import load_tokenizer

    engine_config = engine_config or EngineConfig()
    configure_threads(engine_config.threads)
    with collections_deferred():
        # the weight plan, decided once (engine/weight_plan.py); the load and the model follow it
        checkpoint, plan = load_weights(resolve_model(model), engine_config, progress)
        tokenizer = load_tokenizer(checkpoint.tokenizer_path)
        transformer = build_for_engine(checkpoint, plan, engine_config)
        return LLMEngine(transformer, tokenizer, checkpoint.config, engine_config,
                         eos_token_ids=checkpoint.eos_token_ids,
                         model_name=served_model_name(model),
                         kv_cache=build_kv_cache(checkpoint.config, engine_config, plan.kv_dtype),
                         sampler=build_sampler(engine_config), weight_plan=plan)


@contextlib.contextmanager
def collections_deferred():
    """Python's cyclic garbage collector off for the block (if it was on), on after.

    NOTE: with PyTorch imported the heap holds ~10^6 objects, and every full collection
    scans them all (~0.1 s here); a load allocates enough (a vocabulary's strings, the
    modules, lazy imports) to trigger several. A load makes no cyclic garbage worth
    collecting midway; what it does make is collected at the first collection after.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
