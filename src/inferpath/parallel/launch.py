"""Start N local ranks with a gloo (CPU) or NCCL (GPU) process group.

``run_parallel(fn, world_size, *args)`` spawns ``world_size`` processes that each call
``fn(rank, world_size, *args)`` inside an initialised default process group, and returns
rank 0's result. It binds the rendezvous to 127.0.0.1 on a free port.

Across hosts the processes are started by torch.distributed's own launcher instead
(``torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT
-m inferpath serve MODEL --tp 2``): ``launched_by_torchrun()`` sees its environment
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and ``init_launched_group``
joins the group it describes, so nothing here picks an address or starts a process.
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


_LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun() -> bool:
    """True when this process is one rank of a group a launcher (torchrun) started."""
    return all(name in os.environ for name in _LAUNCHER_ENV) and int(os.environ["WORLD_SIZE"]) > 1


def launched_rank() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment."""
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def init_launched_group(expected_world_size: int, backend: str = "gloo") -> int:
    """Join the launcher's group (``env://``: MASTER_ADDR/PORT, RANK, WORLD_SIZE); return
    this rank. The group must have ``expected_world_size`` ranks (``--tp``): a mismatch is an
    error naming both, never a silently different sharding. gloo, as for local ranks: the
    engine's tensors live on the CPU."""
    rank, world_size = launched_rank()
    if world_size != expected_world_size:
        raise ValueError(f"the launcher started WORLD_SIZE={world_size} ranks but the tensor "
                         f"parallel size is {expected_world_size}; give --tp {world_size} or "
                         f"start {expected_world_size} ranks (--nnodes x --nproc-per-node)")
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://")
    return rank


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
