"""Tensor parallelism over ``torch.distributed``, applied to a built model from outside.

Megatron-style sharding of each layer across ``world_size`` ranks:

    q_proj, k_proj, v_proj   column-parallel: each rank keeps num_heads / N query heads and
                             num_kv_heads / N KV heads (so its KV cache is 1/N as large)
    o_proj                   row-parallel: each rank multiplies its heads' slice of W_O,
                             then one all-reduce sums the partial outputs
    gate_proj, up_proj       column-parallel over the FFN width
    down_proj                row-parallel, then one all-reduce
    MoE experts              every expert sharded like the dense FFN; one all-reduce on the
                             block's output (the router is replicated)
    embedding, norms         replicated
    lm_head                  vocab-parallel when vocab % N == 0 (all-gather of the logits),
                             else replicated

Two all-reduces per layer, as in Megatron-LM. The model file knows none of this: the
sharded model is the same ``Transformer`` with smaller Linear weights and forward hooks
that do the collectives, so the eager path stays the readable reference.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from inferpath.config import ModelConfig


def check_shardable(config: ModelConfig, world_size: int) -> None:
    """Raise ValueError naming the dimension that ``world_size`` does not divide."""
    if world_size < 1:
        raise ValueError(f"tensor parallel size must be >= 1, got {world_size}")
    if world_size > 1:
        # sharding implemented for Llama-style blocks and Mixtral experts only: a bias after
        # the all-reduce would be added once per rank, a norm over all heads needs them all
        unsupported = [name for name in ("o_proj_bias", "mlp_bias", "qk_norm") if getattr(config, name)]
        if config.architecture in ("olmoe", "qwen2_moe", "gemma2", "gemma3_text", "deepseek_v3", "qwen3_next"):
            unsupported.append(f"architecture {config.architecture}")
        if unsupported:
            raise ValueError(f"tensor parallelism does not support {', '.join(unsupported)}; "
                             "run with tensor parallel size 1")
    for name in ("num_heads", "num_kv_heads", "intermediate_size"):
        value = getattr(config, name)
        if value % world_size:
            raise ValueError(
                f"tensor parallel size {world_size} does not divide {name} ({value}); "
                f"choose a size that divides num_heads, num_kv_heads and intermediate_size"
            )


def shard_config(config: ModelConfig, world_size: int) -> ModelConfig:
    """The per-rank shapes: what one rank's KV cache and attention see."""
    check_shardable(config, world_size)
    return replace(
        config,
        num_heads=config.num_heads // world_size,
        num_kv_heads=config.num_kv_heads // world_size,
        intermediate_size=config.intermediate_size // world_size,
    )


def apply_tensor_parallel(model: nn.Module, rank: int, world_size: int, group=None) -> nn.Module:
    """Shard ``model`` (an ``inferpath.model.Transformer`` with weights loaded) in place.

    Every rank must call this on an identical model; afterwards rank r holds slice r of
    every sharded weight, and each forward returns the same (replicated) hidden states and
    logits on every rank. Returns the model for chaining.
    """
    config: ModelConfig = model.config
    check_shardable(config, world_size)
    if world_size == 1:
        return model
    all_reduce = _AllReduceOutput(group)
    for layer in model.model.layers:
        attn = layer.self_attn
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            _shard_rows(proj, rank, world_size)
        attn.num_heads //= world_size
        attn.num_kv_heads //= world_size
        _shard_columns(attn.o_proj, rank, world_size)
        attn.o_proj.register_forward_hook(all_reduce)
        if config.is_moe:
            for expert in layer.block_sparse_moe.experts:
                _shard_rows(expert.w1, rank, world_size)
                _shard_rows(expert.w3, rank, world_size)
                _shard_columns(expert.w2, rank, world_size)
            layer.block_sparse_moe.register_forward_hook(all_reduce)
        else:
            _shard_rows(layer.mlp.gate_proj, rank, world_size)
            _shard_rows(layer.mlp.up_proj, rank, world_size)
            _shard_columns(layer.mlp.down_proj, rank, world_size)
            layer.mlp.down_proj.register_forward_hook(all_reduce)
    if config.vocab_size % world_size == 0:
        # NOTE: a tied head shares the embedding's Parameter; slicing gives the head its own
        # (smaller) Parameter and leaves the replicated embedding whole.
        _shard_rows(model.lm_head, rank, world_size)
        model.lm_head.register_forward_hook(_AllGatherLastDim(group, world_size))
    model.tensor_parallel = (rank, world_size)
    return model


def _shard_rows(linear: nn.Linear, rank: int, world_size: int) -> None:
    """Keep output features [rank * n/N, (rank+1) * n/N): a column-parallel Linear."""
    rows = linear.out_features // world_size
    start = rank * rows
    linear.weight = nn.Parameter(linear.weight.detach()[start:start + rows].clone(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.detach()[start:start + rows].clone(), requires_grad=False)
    linear.out_features = rows


def _shard_columns(linear: nn.Linear, rank: int, world_size: int) -> None:
    """Keep input features of slice ``rank``: a row-parallel Linear (partial sums)."""
    if linear.bias is not None:
        raise ValueError("a row-parallel Linear with a bias would add it N times; not supported")
    cols = linear.in_features // world_size
    start = rank * cols
    linear.weight = nn.Parameter(linear.weight.detach()[:, start:start + cols].contiguous(), requires_grad=False)
    linear.in_features = cols


class _AllReduceOutput:
    """Forward hook: sum a module's partial output over the ranks."""

    def __init__(self, group) -> None:
        self.group = group

    def __call__(self, module, inputs, output: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(output, group=self.group)
        return output


class _AllGatherLastDim:
    """Forward hook: concatenate each rank's vocab slice of the logits."""

    def __init__(self, group, world_size: int) -> None:
        self.group = group
        self.world_size = world_size

    def __call__(self, module, inputs, output: torch.Tensor) -> torch.Tensor:
        # output: (num_rows, vocab / N) -> (num_rows, vocab)
        parts = [torch.empty_like(output) for _ in range(self.world_size)]
        dist.all_gather(parts, output.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)
