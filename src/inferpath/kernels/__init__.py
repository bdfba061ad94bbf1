"""Hand-written CPU kernels, compiled on first use, each with a PyTorch fallback.

Only what PyTorch leaves slow on the decode path lives here: today one kernel, the
matrix-vector product of a decode step in float32 and bfloat16 (``gemv.c``).
``accelerate_linears`` wraps a model's ``nn.Linear`` modules from outside so they call
it (see linear.py).

The C source ships with the package and is built with the system C compiler into the
cache directory the first time it is needed (about a second). A machine without gcc,
without AVX512 (AVX512-BF16 for bf16) or with ``INFERPATH_KERNELS=0`` gets PyTorch's kernels instead:
same results up to float rounding, just slower. ``kernel_status()`` says which and why.
"""

from inferpath.kernels.build import gemv, gemv_available, kernel_status
from inferpath.kernels.linear import CPULinear, accelerate_linears

__all__ = ["CPULinear", "accelerate_linears", "gemv", "gemv_available", "kernel_status"]
