"""Tensor parallelism over torch.distributed, applied from outside the model."""

from inferpath.parallel.launch import run_parallel
from inferpath.parallel.tp import apply_tensor_parallel, check_shardable, shard_config

__all__ = ["apply_tensor_parallel", "check_shardable", "run_parallel", "shard_config"]
