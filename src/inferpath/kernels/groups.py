"""Weight groups: several projections sharing an input (Q/K/V, gate/up) run as one native
matmul whose outputs lie side by side, each weight read where it lies — a quantized
GGUF tensor's blocks in the mapped file, a float checkpoint tensor (a BF16 GGUF's
matrices are views of the mapped file) — with no concatenated copy beside it. One call
and one parallel region cover all the group's output columns (a decode step's matmuls
are small: SmolLM2's K and V projections are 192 x 576).

Each group holds ctypes arrays of its weights' pointers, built once, in the layout the C
kernels take (``native_arguments``: decode.c's ``weight_group`` too): GGUF type ids per
weight (a float group's are GGUF's F32 or BF16 ids), pointers, row bytes, rows, biases.
"""

from __future__ import annotations

import ctypes

import torch

from inferpath.kernels import build, ops, workspace
from inferpath.kernels.repacked import R8_BASE, kernel_type
from inferpath.model.batch_invariant import quant_call_flags, rows_must_be_invariant

GGUF_FLOAT_TYPES = {torch.float32: 0, torch.bfloat16: 30}  # GGUF's ids of F32 and BF16 matrices


class _WeightArrays:
    """The ctypes arrays of a group (see the module doc), kept with the tensors they point
    into."""

    def __init__(self, qtypes: list[int], datas: list[torch.Tensor], rows: list[int],
                 biases: list[torch.Tensor | None]) -> None:
        count = len(datas)
        self._keep = (datas, biases)  # the arrays below point into these tensors
        self._qtypes = (ctypes.c_int * count)(*qtypes)
        self._ptrs = (ctypes.c_void_p * count)(*[d.data_ptr() for d in datas])
        self._row_bytes = (ctypes.c_int64 * count)(*[d.shape[1] * d.element_size() for d in datas])
        self._rows = (ctypes.c_int64 * count)(*rows)
        self._biases = (ctypes.c_void_p * count)(*[None if b is None else b.data_ptr() for b in biases])
        self.num_out = sum(rows)

    def native_arguments(self) -> tuple:
        """(count, qtypes, weights, row bytes, rows, biases): the group as the C kernels take
        it (``inferpath_quant_matmul_group``, decode.c's ``weight_group``)."""
        return len(self._qtypes), self._qtypes, self._ptrs, self._row_bytes, self._rows, self._biases


class QuantGroup(_WeightArrays):
    """Quantized weights (``QuantizedTensor``s, float32 biases or None) with one float32
    input: x is quantized once for all of them (``inferpath_quant_matmul_group``)."""

    def __init__(self, fn, weights: list, biases: list) -> None:
        types = [kernel_type(w) for w in weights]  # a RepackedTensor's is its r8 id
        super().__init__(types, [w.data for w in weights], [w.shape[0] for w in weights], biases)
        self._fn = fn
        self._blocks, self._bias_list = list(zip([w.data for w in weights], types)), biases  # for dequantized tiles
        self.in_features = weights[0].shape[1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (m, in_features) float32 contiguous -> (m, num_out) float32: the fused kernels
        (``ops.quant_rows_fused``), else dequantized tiles spanning the weights, one GEMM each."""
        if not ops.quant_rows_fused(x.shape[0], repacked=all(t >= R8_BASE for _, t in self._blocks)):
            return ops.dequantized_linear(x, self._blocks, self._bias_list, build.native_quant_dequantize())
        ops.note_dispatch("quant-rows" if rows_must_be_invariant() else "quant-fused", x.shape[0])
        out = workspace.empty((x.shape[0], self.num_out), torch.float32)
        status = self._fn(*self.native_arguments(),
                          x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], torch.get_num_threads(),
                          quant_call_flags())
        if status != 0:
            raise RuntimeError(f"quantized group matmul rejected x={tuple(x.shape)} (status {status})")
        return out


class FloatGroup(_WeightArrays):
    """Float weights (one dtype, contiguous (rows, in_features) each) through the native GEMV
    (``inferpath_gemv_group_*``), for x of each dtype in ``variants``: activation dtype ->
    (group function, ``ops.linear_kernels``-form tuple of the single-matrix GEMV). x of the
    weights' dtype, or float32 x against bf16 weights (``inferpath_gemv_group_bf16_weights``,
    the weights widened in the kernel); biases in x's dtype or None. Each output value is
    the one the single-matrix GEMV gives (same kernel, same chain over k), so a group equals
    its projections run one by one (``ops.small_batch_linear``, ``bf16_weights.bf16_weight_linear``)
    for the row counts that take the GEMV there (``serves``); other row counts take the
    projections' own modules (AMX, oneDNN, widened tiles)."""

    def __init__(self, weights: list[torch.Tensor], biases: list, variants: dict) -> None:
        super().__init__([GGUF_FLOAT_TYPES[weights[0].dtype]] * len(weights), weights, [w.shape[0] for w in weights],
                         biases)
        self._variants = variants
        self.dtype = weights[0].dtype  # of the weights
        self.in_features = weights[0].shape[1]

    def runs(self, activations: torch.dtype) -> bool:
        """Whether the group takes x of ``activations``."""
        return activations in self._variants

    def serves(self, rows: int, activations: torch.dtype) -> bool:
        """Whether the single-matrix path takes the GEMV for ``rows`` rows of x of
        ``activations`` (and so this group may run them)."""
        return self.kernel(rows, activations) == "gemv"

    def kernel(self, rows: int, activations: torch.dtype) -> str:
        """The kernel each projection's own module runs ``rows`` rows of x of ``activations``
        through (``ops.float_kernel_for``: "gemv", "amx" or "torch"), "" for x the group
        does not take."""
        variant = self._variants.get(activations)
        return "" if variant is None else ops.float_kernel_for(rows, variant[1])

    def amx_gemm(self, activations: torch.dtype):
        """The AMX GEMM the projections' modules run x of ``activations`` through where
        ``kernel`` says "amx" (``ops.linear_kernels``), or None."""
        variant = self._variants.get(activations)
        return None if variant is None else variant[1][1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (m, in_features) contiguous, a dtype the group ``runs`` -> (m, num_out) of it."""
        count, _, ptrs, _, rows, biases = self.native_arguments()
        ops.note_dispatch("gemv", x.shape[0])
        out = workspace.empty((x.shape[0], self.num_out), x.dtype)
        status = self._variants[x.dtype][0](count, ptrs, rows, biases, x.data_ptr(), out.data_ptr(), x.shape[0],
                                            x.shape[1], torch.get_num_threads())
        if status != 0:
            raise RuntimeError(f"gemv group rejected x={tuple(x.shape)} (status {status})")
        return out
