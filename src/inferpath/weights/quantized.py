"""Quantized GGUF tensors kept in their block layout (no dequantization at load).

A ``QuantizedTensor`` is a (rows, row_bytes) uint8 view of the memory-mapped file: each
row is one output row of a weight (``cols`` values in GGUF blocks), so row slicing and row
permutation (llama.cpp's Q/K order) work on bytes. The kernels in ``inferpath.kernels``
compute with it in place (kernels/quantized.py); ``dequantize`` gives the float32 values
(the reference, and the path for machines without the kernels).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
# The block formats the native kernels read in place (kernels/csrc/quant/blocks.h).
QUANTIZED_TYPES = frozenset({Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K,
                             Q.MXFP4})  # MXFP4: its own kernel file (csrc/quant/mxfp4.c)


@dataclass(frozen=True)
class QuantizedTensor:
    """A 2-D weight (rows, cols) in a GGUF block format.

    Invariant: ``data`` is (rows, row_bytes) uint8 with row_bytes = cols / block_size *
    type_size, rows contiguous; it may be a view of the mapped file (never written after
    the load: weights/gguf.py puts Q/K rows in order first).
    """

    data: torch.Tensor
    qtype: GGMLQuantizationType
    shape: tuple[int, int]

    @classmethod
    def from_gguf(cls, data: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int]) -> "QuantizedTensor":
        """Wrap a GGUF tensor's bytes (rows, row_bytes) without copying them."""
        block, size = GGML_QUANT_SIZES[qtype]
        rows, cols = shape
        data = data.reshape(rows, cols // block * size)
        with warnings.catch_warnings():  # a read-only array (the kernels only read it)
            warnings.simplefilter("ignore", UserWarning)
            return cls(torch.from_numpy(data), qtype, (rows, cols))

    @property
    def type_name(self) -> str:
        return self.qtype.name

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def dequantize(self) -> torch.Tensor:
        """The float32 values (rows, cols), by the gguf package (the reference)."""
        from gguf.quants import dequantize

        return torch.from_numpy(dequantize(self.data.numpy(), self.qtype).reshape(self.shape))
