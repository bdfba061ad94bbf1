"""Hand-written CPU kernels, compiled on first use, each with a PyTorch fallback.

Only what PyTorch leaves slow on the decode path lives here (``csrc/``), in float32 and
bfloat16: the matrix-vector product of a decode step's few rows, RMSNorm, the SwiGLU
gate, paged decode attention and the greedy argmax over the vocabulary. ``accelerate``
swaps a model's ``nn.Linear``, ``RMSNorm``, ``SiluAndMul`` and ``PagedAttention``
modules, from outside, for subclasses that call them (modules.py).

The C sources ship with the package and are built with the system C compiler into the
cache directory the first time they are needed (a few seconds). A machine without gcc,
without AVX512 (AVX512-BF16 for bf16) or with ``INFERPATH_KERNELS=0`` gets PyTorch's
kernels instead: same results up to float rounding, just slower. ``kernel_status()``
says which and why.
"""

from inferpath.kernels.build import gemv_available, kernel_status
from inferpath.kernels.modules import CPULinear, CPUPagedAttention, CPURMSNorm, CPUSiluAndMul, accelerate
from inferpath.kernels.ops import argmax_rows, gemv

__all__ = ["CPULinear", "CPUPagedAttention", "CPURMSNorm", "CPUSiluAndMul", "accelerate",
           "argmax_rows", "gemv", "gemv_available", "kernel_status"]
