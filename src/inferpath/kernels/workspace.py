"""Kept buffers for the large outputs of a prompt's step.

glibc serves an allocation above its mmap threshold (dynamic, 32 MB at most) with pages
mapped afresh and unmapped again on free, so a tensor of that size allocated by every layer
is faulted in page by page every time. A 512-token prompt's fused gate/up output on the 1.5B
Q4_K_M file is 512 x 17920 float32 (36.7 MB): about 9,000 page faults a layer, which took
~8 of the GEMM's 38 ms (AMD EPYC Zen 5, 2 threads; a 512-token prefill 253 -> 324 and 236 -> 277
tok/s in two runs with the outputs kept, docs/kquant_kernels.md). ``empty`` hands such outputs out of a
few buffers kept per thread instead: one whose storage no tensor holds any more (its
previous output dropped), else a new one. Below ``MIN_BYTES`` it is ``torch.empty``.

The contents are whatever the last user left: callers write every element (the GEMMs,
the SwiGLU pass), as they would write a ``torch.empty`` tensor's.
"""

from __future__ import annotations

import threading

import torch

MIN_BYTES = 16 << 20  # smaller tensors come from malloc's heap, already mapped
KEPT = 4  # buffers kept per thread: a layer's outputs alive at once (gate/up and its SwiGLU)
MAX_KEPT_BYTES = 512 << 20  # past this a thread keeps no more (the buffer is allocated and dropped)

_local = threading.local()
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _free(buffer: torch.Tensor) -> bool:
    """Whether nothing but the kept tensor holds buffer's storage (the count's 2: that tensor
    and the storage object asked)."""
    return _use_count(buffer.untyped_storage()._cdata) <= 2


def empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialized contiguous tensor of ``shape`` and ``dtype``: from a kept buffer
    where it is ``MIN_BYTES`` or more, else ``torch.empty``."""
    count = 1
    for size in shape:
        count *= size
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    if nbytes < MIN_BYTES or _use_count is None:
        return torch.empty(shape, dtype=dtype)
    kept: list[torch.Tensor] = getattr(_local, "buffers", None) or []
    _local.buffers = kept
    free = [b for b in kept if _free(b)]
    fits = [b for b in free if b.numel() >= nbytes]
    if fits:
        buffer = min(fits, key=torch.Tensor.numel)
    else:
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        while free and (len(kept) >= KEPT or kept_bytes() + nbytes > MAX_KEPT_BYTES):
            gone = free.pop(0)  # make room: free buffers too small for this output go
            kept[:] = [b for b in kept if b is not gone]  # by identity (== compares tensors' values)
        if len(kept) < KEPT and kept_bytes() + nbytes <= MAX_KEPT_BYTES:
            kept.append(buffer)
    return buffer[:nbytes].view(dtype).view(shape)


def kept_bytes() -> int:
    """The bytes this thread keeps (for tests and the memory report)."""
    return sum(b.numel() for b in getattr(_local, "buffers", None) or [])


def release() -> None:
    """Drop this thread's kept buffers (their memory goes back once no output holds it)."""
    _local.buffers = []
