"""Start N local ranks with a gloo (CPU) or NCCL (GPU) process group.

``run_parallel(fn, world_size, *args)`` spawns ``world_size`` processes that each call
``fn(rank, world_size, *args)`` inside an initialised default process group, and returns
rank 0's result. It binds the rendezvous to 127.0.0.1 on a free port.
"""

from __future__ import annotations

import io
import os
import socket
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_local_group(rank: int, world_size: int, port: int, backend: str = "gloo") -> None:
    """Join the default process group whose rendezvous is 127.0.0.1:``port``."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def _worker(rank: int, world_size: int, port: int, backend: str, fn: Callable, args: tuple, results) -> None:
    torch.set_num_threads(1)
    init_local_group(rank, world_size, port, backend)
    try:
        result = fn(rank, world_size, *args)
        if rank == 0:
            # NOTE: a tensor sent through a multiprocessing queue is shared by file descriptor,
            # which dies with this process; send serialized bytes instead.
            buffer = io.BytesIO()
            torch.save(result, buffer)
            results.put(buffer.getvalue())
        # NOTE: every rank is past its last collective before any tears its group down: a
        # rank whose peer's gloo connections close under it mid-teardown can abort
        # ("terminate called without an active exception"), seen once in CI.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_parallel(fn: Callable[..., Any], world_size: int, *args: Any, backend: str | None = None) -> Any:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local ranks; return rank 0's value.

    ``fn`` must be importable (a module-level function) since ranks are spawned processes, and
    its result made of tensors and plain Python values.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    backend = backend or ("nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(world_size, free_port(), backend, fn, args, results),
                       nprocs=world_size, join=True, start_method="spawn")
    return torch.load(io.BytesIO(results.get()), weights_only=True)
