"""Kept buffers for the large outputs of a prompt's step.

glibc serves an allocation above its mmap threshold (dynamic, 32 MB at most) with pages
mapped afresh and unmapped again on free, so a tensor of that size allocated by every layer
is faulted in page by page every time. A 512-token prompt's fused gate/up output on the 1.5B
Q4_K_M file is 512 x 17920 float32 (36.7 MB): about 9,000 page faults a layer, which took
~8 of the GEMM's 38 ms (AMD EPYC Zen 5, 2 threads; a 512-token prefill 253 -> 324 and 236 -> 277
tok/s in two runs with the outputs kept, docs/kquant_kernels.md). ``empty`` hands such outputs out of a
few buffers kept by the process instead: one whose storage no tensor holds any more (its
previous output dropped), else a new one. Below ``MIN_BYTES`` it is ``torch.empty``.

NOTE: one set for the process, behind a lock, not one per thread: the engine's steps run on
executor threads that outlive their engines, and a set per thread grew with them (a test
run's process reached 24 GB). The view handed out is made under the lock, so the buffer is
held before another thread looks at it.

The contents are whatever the last user left: callers write every element (the GEMMs,
the SwiGLU pass), as they would write a ``torch.empty`` tensor's.
"""

from __future__ import annotations

import math
import threading

import torch

MIN_BYTES = 16 << 20  # smaller tensors come from malloc's heap, already mapped
KEPT = 4  # buffers kept: a layer's outputs alive at once (gate/up and its SwiGLU), and a spare
MAX_KEPT_BYTES = 256 << 20  # past this no more is kept, and no larger output (a long prompt's every-row logits)

_lock = threading.Lock()
_kept: list[torch.Tensor] = []  # uint8 buffers, each alone in its storage
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _free(buffer: torch.Tensor) -> bool:
    """Whether nothing but the kept tensor holds buffer's storage (the count's 2: that tensor
    and the storage object asked)."""
    return _use_count(buffer.untyped_storage()._cdata) <= 2


def empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialized contiguous tensor of ``shape`` and ``dtype``: from a kept buffer
    where it is ``MIN_BYTES`` to ``MAX_KEPT_BYTES``, else ``torch.empty``."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES or nbytes > MAX_KEPT_BYTES or _use_count is None:
        return torch.empty(shape, dtype=dtype)
    with _lock:
        free = [b for b in _kept if _free(b)]
        fits = [b for b in free if b.numel() >= nbytes]
        if fits:
            buffer = min(fits, key=torch.Tensor.numel)
        else:
            buffer = torch.empty(nbytes, dtype=torch.uint8)
            while free and (len(_kept) >= KEPT or _kept_bytes() + nbytes > MAX_KEPT_BYTES):
                gone = free.pop(0)  # make room: free buffers too small for this output go
                _kept[:] = [b for b in _kept if b is not gone]  # by identity (== compares tensors' values)
            if len(_kept) < KEPT and _kept_bytes() + nbytes <= MAX_KEPT_BYTES:
                _kept.append(buffer)
        return buffer[:nbytes].view(dtype).view(shape)


def _kept_bytes() -> int:
    return sum(b.numel() for b in _kept)


def kept_bytes() -> int:
    """The bytes kept (for tests and the memory report)."""
    with _lock:
        return _kept_bytes()


def kept_buffers() -> list[torch.Tensor]:
    """The kept buffers themselves (uint8; for tests)."""
    with _lock:
        return list(_kept)


def release() -> None:
    """Drop the kept buffers (their memory goes back once no output holds it)."""
    with _lock:
        _kept.clear()
