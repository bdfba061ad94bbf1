"""How many threads compute, and how they wait: chosen deliberately, for the native kernels
and PyTorch alike (both run on the one OpenMP pool of libgomp).

- Count: the physical cores this process may run on (hyper-threads share a core's
  vector units and add nothing to a memory-bound decode), or ``EngineConfig.threads``.
- Waiting: OpenMP threads that finish a parallel region spin-wait for the next by
  default. On a machine where other programs run, a spinning thread holds a core that the
  thread it waits for needs, and a decode step (hundreds of short regions) slows 10x or
  more (measured: 2.8 -> 41.7 tok/s on a 2-core VM with other work running).
  ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep) is set as the default when inferpath is
  imported before torch; an explicit setting in the environment wins. libgomp reads it
  once, when it loads: importing torch first leaves its policy as it was.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_WAIT_POLICY = "PASSIVE"


def set_default_wait_policy() -> None:
    """OMP_WAIT_POLICY=PASSIVE unless the environment says otherwise (module doc)."""
    os.environ.setdefault("OMP_WAIT_POLICY", DEFAULT_WAIT_POLICY)


def physical_cores() -> int:
    """Physical cores among the CPUs this process may use (at least 1)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores: set[tuple[str, str]] = set()
    try:
        processor = physical = None
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "processor":
                processor, physical = int(value), "0"
            elif key == "physical id":
                physical = value
            elif key == "core id" and processor in allowed:
                cores.add((physical, value))
    except (OSError, ValueError):
        pass
    return max(1, min(len(cores) or len(allowed), len(allowed)))


def configure_threads(threads: int | None) -> int:
    """Set PyTorch's (and so the kernels') thread count: ``threads`` or the physical
    cores. Returns the count."""
    import torch

    count = threads or physical_cores()
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


def wait_policy() -> str:
    return os.environ.get("OMP_WAIT_POLICY", "libgomp default (spin, then sleep)")
