"""Hand-written CPU kernels, compiled on first use, each with a PyTorch fallback.

Only what PyTorch leaves slow on the decode path lives here (``csrc/``), in float32 and
bfloat16: the matrix-vector product of a decode step's few rows, RMSNorm, the SwiGLU
gate, paged decode attention and the greedy argmax over the vocabulary. ``accelerate``
swaps a model's ``nn.Linear``, ``RMSNorm``, ``SiluAndMul`` and ``PagedAttention``
modules, from outside, for subclasses that call them (modules.py).

The C sources ship with the package and are built with the system C compiler into the
cache directory the first time they are needed (a few seconds), once per instruction-set
level: portable C (``generic``, any CPU), the same sources for AVX2+FMA+F16C (``avx2``),
and with AVX-VNNI too (``avxvnni``: Intel's client cores, AMD Zen 5), and intrinsics for
AVX-512 (``avx512``, with VNNI, BF16 and AMX where present). The best
level the CPU reports runs, or a lower one forced with ``INFERPATH_ISA``. Without gcc or
with ``INFERPATH_KERNELS=0`` PyTorch's kernels run instead: same results up to float
rounding, just slower. ``kernel_status()`` names the level and each family's state.
"""

from inferpath.kernels.build import gemv_available, kernel_status
from inferpath.kernels.modules import CPULinear, CPUPagedAttention, CPURMSNorm, CPUSiluAndMul, accelerate
from inferpath.kernels.ops import argmax_rows, gemv

__all__ = ["CPULinear", "CPUPagedAttention", "CPURMSNorm", "CPUSiluAndMul", "accelerate",
           "argmax_rows", "gemv", "gemv_available", "kernel_status"]
