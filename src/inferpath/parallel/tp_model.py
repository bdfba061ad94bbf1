"""A model sharded over N local processes that the engine drives like any other model.

Rank 0 is the engine's own process; ranks 1..N-1 are spawned workers, or, under torchrun
(across hosts), processes the launcher started that run ``run_launched_worker``. Each rank loads the
checkpoint, keeps its shard (``apply_tensor_parallel``) and its own slice of the KV cache
(``num_kv_heads / N`` heads, same block ids). Every ``forward`` / ``compute_logits`` call
on rank 0 is first broadcast to the workers, which make the same call on their shard, so
the collectives inside the layers (all-reduce after o_proj and down_proj, all-gather of the
logits) line up. The engine, scheduler and runner do not know the model is sharded: only
the KV cache's per-rank shape (``shard_config``) changes.

    rank 0 (engine):  broadcast(step inputs) -> forward(shard) ─┐ all-reduce x 2 per layer
    rank r (worker):  receive(step inputs)   -> forward(shard) ─┘
"""

from __future__ import annotations

import atexit
import multiprocessing
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from inferpath.cache.kv import KVCache
from inferpath.parallel.launch import (
    free_port,
    init_launched_group,
    init_local_group,
    launched_by_torchrun,
    launched_rank,
)
from inferpath.parallel.tp import apply_tensor_parallel, check_shardable, shard_config

_FORWARD, _LOGITS, _STOP = "forward", "logits", "stop"


def _build_shard(checkpoint, plan, rank: int, world_size: int, cpu_kernels: bool):
    """A rank's shard of the model ``plan`` (engine/weight_plan.py, sharded: float weights in
    ``plan.activation_dtype``) describes."""
    from inferpath.kernels import accelerate
    from inferpath.model import build_model

    shard = apply_tensor_parallel(build_model(checkpoint, plan.activation_dtype), rank, world_size)
    if cpu_kernels:
        accelerate(shard)  # after sharding: the kernels see each rank's slice
    return shard


def _worker_main(rank: int, world_size: int, port: int, path: str, plan, num_threads: int,
                 cpu_kernels: bool) -> None:
    """A spawned rank r > 0: join rank 0's local group, then serve as a worker."""
    torch.set_num_threads(num_threads)
    init_local_group(rank, world_size, port)
    _mirror_rank0(rank, world_size, path, plan, cpu_kernels)


def run_launched_worker(num_threads: int | None = None) -> None:
    """A rank r > 0 that torchrun started: join the launcher's group, receive the model's
    path and weight plan from rank 0, then mirror rank 0's calls until it says stop."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    rank, world_size = launched_rank()
    init_launched_group(world_size)
    message = [None]
    dist.broadcast_object_list(message, src=0)
    path, plan, cpu_kernels = message[0]
    _mirror_rank0(rank, world_size, path, plan, cpu_kernels)


def _mirror_rank0(rank: int, world_size: int, path: str, plan, cpu_kernels: bool) -> None:
    """Load this rank's shard by rank 0's weight plan, then make each call rank 0 makes."""
    from inferpath.engine.load import load_by_plan

    dtype = plan.kv_dtype
    model = _build_shard(load_by_plan(Path(path), plan), plan, rank, world_size, cpu_kernels)
    cache: KVCache | None = None
    with torch.inference_mode():
        while True:
            message = [None]
            dist.broadcast_object_list(message, src=0)
            command, payload = message[0]
            if command == _STOP:
                break
            if command == _FORWARD:
                input_ids, positions, meta, num_blocks, block_size = payload
                if cache is None or cache.num_blocks != num_blocks or cache.block_size != block_size:
                    cache = KVCache(shard_config(model.config, world_size), num_blocks, block_size, dtype)
                model(input_ids, positions, cache, meta)
            elif command == _LOGITS:
                model.compute_logits(payload)
    dist.destroy_process_group()


class TensorParallelModel(nn.Module):
    """Rank 0's handle on a model sharded over ``world_size`` local processes (gloo).

    Exposes the model interface the runner uses: ``config``, ``dtype``, ``forward`` and
    ``compute_logits``. ``close()`` stops the workers (also at interpreter exit).
    """

    def __init__(self, checkpoint, plan, cpu_kernels: bool = True) -> None:
        """``checkpoint``: rank 0 builds its shard from it; the workers load ``checkpoint.path``
        by the same weight ``plan`` (engine/weight_plan.py), sharded over
        ``plan.tensor_parallel_size`` ranks."""
        super().__init__()
        config = checkpoint.config
        world_size = plan.tensor_parallel_size
        check_shardable(config, world_size)
        self.world_size = world_size
        self._workers = []
        if launched_by_torchrun():
            # the ranks were started by the launcher, on this host or others: join its group
            # and tell the workers (run_launched_worker) what to load
            if launched_rank()[0] != 0:
                raise RuntimeError("only rank 0 builds the engine; other ranks run "
                                   "run_launched_worker()")
            init_launched_group(world_size)
            dist.broadcast_object_list([(str(checkpoint.path), plan, cpu_kernels)], src=0)
        else:
            port = free_port()
            ctx = multiprocessing.get_context("spawn")
            threads = max(1, torch.get_num_threads() // world_size)
            self._workers = [
                ctx.Process(target=_worker_main, daemon=True,
                            args=(rank, world_size, port, str(checkpoint.path), plan, threads, cpu_kernels))
                for rank in range(1, world_size)
            ]
            for worker in self._workers:
                worker.start()
            torch.set_num_threads(threads)
            init_local_group(0, world_size, port)
        self.shard = _build_shard(checkpoint, plan, 0, world_size, cpu_kernels)
        self.config = config
        self._closed = False
        atexit.register(self.close)  # before multiprocessing reaps the daemon workers

    @property
    def dtype(self) -> torch.dtype:
        return self.shard.dtype

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta) -> torch.Tensor:
        payload = (input_ids, positions, meta, kv_cache.num_blocks, kv_cache.block_size)
        dist.broadcast_object_list([(_FORWARD, payload)], src=0)
        return self.shard(input_ids, positions, kv_cache, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden is replicated on every rank after the all-reduces; send rank 0's rows
        dist.broadcast_object_list([(_LOGITS, hidden)], src=0)
        return self.shard.compute_logits(hidden)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        dist.broadcast_object_list([(_STOP, None)], src=0)
        for worker in self._workers:
            worker.join(timeout=30)
        dist.destroy_process_group()
