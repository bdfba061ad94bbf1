"""Which kernel each linear ran through, recorded on request: how tests (and the trace)
see the dispatch of kernels/ops.py and kernels/quant_ops.py, row count by row count.

Off by default: a linear pays one attribute read of a thread-local to learn that no one
is recording (``is_recording``).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import NamedTuple

from inferpath.model.batch_invariant import rows_must_be_invariant


class KernelChoice(NamedTuple):
    """One linear's dispatch, as ``recording_dispatch`` logs it: ``kernel`` is "gemv", "amx",
    "torch" (``F.linear``: oneDNN / MKL), "rowwise" (``F.linear`` one row at a time),
    "quant-fused" (the int8 kernels, free to block rows: wide tiles, GEMM panels),
    "quant-amx-int8" (the same GEMM panels through the AMX-INT8 engine: ``quant_fused_kernel``),
    "quant-rows" (the same kernels, each row alone) or "quant-tiled" (dequantized tiles
    and PyTorch's GEMM); ``invariant``: inside ``row_invariant_dispatch``."""

    kernel: str
    rows: int
    invariant: bool


_log = threading.local()


@contextmanager
def recording_dispatch():
    """Within the block (this thread), every linear that goes through kernels/ops.py (float
    and quantized, groups included) appends its ``KernelChoice`` to the yielded list: how
    tests see which kernel a row ran through. Off by default (one attribute read a call)."""
    previous = getattr(_log, "entries", None)
    _log.entries = entries = []
    try:
        yield entries
    finally:
        _log.entries = previous


def note_dispatch(kernel: str, rows: int) -> None:
    """Log a linear's kernel choice where ``recording_dispatch`` is on."""
    entries = getattr(_log, "entries", None)
    if entries is not None:
        entries.append(KernelChoice(kernel, rows, rows_must_be_invariant()))


def is_recording() -> bool:
    """Whether ``recording_dispatch`` is on in this thread (for a caller whose choice costs
    something to name)."""
    return getattr(_log, "entries", None) is not None
