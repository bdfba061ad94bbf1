"""Calls into the native kernels: argument layout, output allocation, and the dispatch
between the native kernels and PyTorch by dtype and row count (build.py loads them). The
quantized kernels' calls are in quant_ops.py, the record of which kernel ran in
dispatch_log.py; both are re-exported here.

The cutoffs were measured on the 2-core AVX512/AMX VM over one decode step's SmolLM2
matrices (Q/K/V and gate/up fused, weights not in cache), in ms, kernel vs PyTorch:

- GEMV (any number of rows, in groups of 4 that re-read a weight block from L1; past some
  rows it is compute-bound): fp32 rows 4: 21 vs 36, 8: 29 vs 46, 16: 40 vs 54, 32: 66 vs
  74, 64: 96 vs 79; bf16 rows 1: 16 vs 38, 4: 13 vs 19, 8: 22 vs 22, 16: 36 vs 22.
- AMX GEMM (bf16; reads the weights once per 64 rows): rows 1: 14 vs 31, 8: 16 vs 33,
  32: 15 vs 27, 64: 24 vs 34, 96: 41 vs 46, 128: 57 vs 64, 192: 88 vs 92. Engine A/B,
  step ms GEMV-or-oneDNN vs AMX: batch 1 30.5 vs 31.4, 4 35.4 vs 31.0, 32 59.2 vs 42.5.
- bf16 GEMV on a CPU without AMX (AMD EPYC Zen 4, avx512_bf16: oneDNN's bf16 matmul runs
  on the same vdpbf16ps), SmolLM2's 30 layers of matrices one by one, 1 thread: rows 8:
  10.7 vs 16.4, 16: 14.4 vs 19.4, 24: 20.0 vs 22.8, 32: 27.3 vs 27.0, 48: 38.1 vs 31.9;
  2 threads: 24: 10.7 vs 13.2, 32: 13.4 vs 15.8, 48: 20.3 vs 19.8.

On an AMX CPU the GEMV keeps 1 to 4 bf16 rows (``AMX_MIN_ROWS``): it meets x four rows at a
time, so up to four rows it reads each weight block once, as AMX does (GEMV 4 rows 13 ms,
AMX 1 to 8 rows 14 to 16 ms above). The native decode call (kernels/decode_stack.py) runs
both as the modules do: the GEMV for the rows that take it, and from five rows (a prompt
chunk, a verification, a batch of five) the AMX GEMM, one projection at a time.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from inferpath.kernels import build
from inferpath.kernels.dispatch_log import KernelChoice, note_dispatch, recording_dispatch  # noqa: F401 - re-exported
from inferpath.kernels.quant_ops import (DEQUANT_TILE_VALUES, QUANT_MATMUL_MAX_ROWS,  # noqa: F401 - re-exported
                                         R8_MATMUL_MAX_ROWS, dequantized_linear, quant_fused_kernel,
                                         quant_rows_fused, quantized_linear, run_dequantize, run_quant_matmul)
from inferpath.model.batch_invariant import rows_must_be_invariant, rowwise_linear

GEMV_MAX_ROWS = {torch.float32: 32, torch.bfloat16: 8}
GEMV_MAX_ROWS_WITHOUT_AMX = {torch.float32: 32, torch.bfloat16: 32}  # (avx512 level; see above)
# The portable GEMV (generic and avx2 levels) meets x four rows at a time with no register
# blocking across weight rows: past a few rows MKL/oneDNN wins. NOTE: set from the shape
# of the code, not measured on a quiet machine (this one was shared during the work).
PORTABLE_GEMV_MAX_ROWS = {torch.float32: 8, torch.bfloat16: 4}
AMX_MIN_ROWS = 5  # up to four rows the GEMV reads the weights once too (module doc)
AMX_MAX_ROWS = 128
# The attention kernel's register arrays (csrc/attention.c MAX_HEAD_DIM, MAX_GROUP): larger
# heads or query groups take PyTorch's SDPA.
ATTENTION_MAX_HEAD_DIM = 256
ATTENTION_MAX_GROUP = 16


def run_gemv(fn, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Call a ``native_gemv`` or ``native_amx_gemm`` function without re-checking: x (m, k)
    contiguous, weight (n, k) contiguous, bias (n,) contiguous or None, one dtype."""
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype)
    status = fn(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
                out.data_ptr(), x.shape[0], weight.shape[0], x.shape[1], torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"gemv rejected shapes x={tuple(x.shape)} weight={tuple(weight.shape)}")
    return out


def kernel_ready(dtype: torch.dtype, *tensors: torch.Tensor | None) -> bool:
    """Whether the kernels may read ``tensors`` (None ones skipped) in place: contiguous CPU
    tensors of ``dtype``."""
    return all(t is None or (t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous())
               for t in tensors)


class LinearKernels(NamedTuple):
    """The kernels a float matrix may run through (None where one cannot serve it) and the
    most rows its GEMV takes; ``linear_kernels`` makes it, ``float_kernel_for`` picks."""

    gemv: object
    amx: object
    gemv_max_rows: int


def gemv_max_rows(dtype: torch.dtype, level: str | None, amx: bool) -> int:
    """The most rows of ``dtype`` the GEMV of ``level`` takes, on a CPU whose AMX GEMM runs
    (``amx``) or not (the cutoffs in the module doc)."""
    if level != "avx512":
        return PORTABLE_GEMV_MAX_ROWS[dtype]
    return (GEMV_MAX_ROWS if amx else GEMV_MAX_ROWS_WITHOUT_AMX)[dtype]


def linear_kernels(weight: torch.Tensor, bias: torch.Tensor | None) -> LinearKernels:
    """The kernels for an ``nn.Linear``'s weight and bias, the functions None where they
    cannot serve them (dtype, device, layout; AMX needs in_features % 32 == 0)."""
    dtype = weight.dtype
    if not kernel_ready(dtype, weight, bias) or dtype not in GEMV_MAX_ROWS:
        return LinearKernels(None, None, 0)
    amx = build.native_amx_gemm(dtype)
    max_rows = gemv_max_rows(dtype, build.kernel_level(dtype), amx is not None)
    return LinearKernels(build.native_gemv(dtype), amx if weight.shape[1] % 32 == 0 else None, max_rows)


def float_kernel_for(rows: int, kernels: tuple) -> str:
    """Which kernel ``small_batch_linear`` runs ``rows`` rows of x (of the weight's dtype,
    2-D) through: "gemv", "amx" or "torch" (``F.linear``: oneDNN / MKL, or ``rowwise_linear``
    where rows must be batch-invariant). ``kernels``: ``linear_kernels``' form."""
    gemv_fn, amx_fn, max_rows = kernels
    if rows_must_be_invariant():
        return "gemv" if gemv_fn is not None else "torch"
    if amx_fn is not None and AMX_MIN_ROWS <= rows <= AMX_MAX_ROWS:
        return "amx"
    return "gemv" if gemv_fn is not None and rows <= max_rows else "torch"


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kernels: tuple):
    """x @ weight.T + bias through the kernel that serves x's row count best (AMX for bf16
    from AMX_MIN_ROWS to AMX_MAX_ROWS rows, else the GEMV up to its level's cutoff), else
    ``F.linear``. ``kernels`` comes from ``linear_kernels``. Inside
    ``row_invariant_dispatch`` (model/batch_invariant.py): the GEMV for any number of rows
    (each output is one FMA chain over k then one lane reduction, csrc/avx512/gemv.c, whatever m
    is), else ``rowwise_linear``; never AMX or oneDNN, whose blocking follows the row count.
    NOTE: the portable GEMV (generic, avx2 levels) vectorises its 4-row and 1-row loops
    separately; the compiler does not promise them the same summation order."""
    kernel = float_kernel_for(x.shape[0], kernels) if x.dtype == weight.dtype and x.dim() == 2 else "torch"
    note_dispatch("rowwise" if kernel == "torch" and rows_must_be_invariant() else kernel, x.shape[0])
    if kernel != "torch":
        return run_gemv(kernels[0] if kernel == "gemv" else kernels[1], x.contiguous(), weight, bias)
    if rows_must_be_invariant():
        return rowwise_linear(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


def gemv_serves(rows: int, kernels: tuple) -> bool:
    """Whether ``small_batch_linear`` runs ``rows`` rows of x (of the weight's dtype, 2-D)
    through the GEMV; ``kernels`` comes from ``linear_kernels``."""
    return float_kernel_for(rows, kernels) == "gemv"


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias with the native GEMV, any number of rows: x (m, k) -> (m, n).

    Falls back to ``F.linear`` when the kernel is unavailable or the inputs do not fit it
    (dtype, device, layout, rows), so it is always correct to call.
    """
    dtype = x.dtype
    fn = build.native_gemv(dtype)
    if (fn is None or x.dim() != 2 or x.device.type != "cpu"
            or weight.dtype != dtype or not weight.is_contiguous()
            or (bias is not None and (bias.dtype != dtype or not bias.is_contiguous()))):
        return torch.nn.functional.linear(x, weight, bias)
    return run_gemv(fn, x.contiguous(), weight, bias)


def run_rms_norm(fn, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Call a ``native_rms_norm`` function: x (m, n) contiguous, weight (n,), one dtype."""
    out = torch.empty_like(x)
    if fn(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps,
          torch.get_num_threads()) != 0:
        raise RuntimeError(f"rms_norm rejected shape x={tuple(x.shape)}")
    return out


def run_silu_mul(fn, gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """out = silu(gate) * up for (rows, n) tensors of one dtype whose last dimension is
    contiguous (rows may be strided, e.g. the halves of a fused gate/up output); ``out``
    defaults to ``gate`` itself (in place). Returns out."""
    out = gate if out is None else out
    status = fn(gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), out.data_ptr(), out.stride(0),
                gate.shape[0], gate.shape[1], torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"silu_mul rejected shapes gate={tuple(gate.shape)} up={tuple(up.shape)}")
    return out


def run_rope(fn, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor):
    """(q_rot, k_rot), new contiguous tensors. q (tokens, heads, d) and k (tokens,
    kv_heads, d) with contiguous heads (rows may be strided); cos, signed_sin (tokens, d)
    contiguous; one dtype; d % 32 == 0."""
    tokens, heads, d = q.shape
    q_out, k_out = torch.empty((tokens, heads, d), dtype=q.dtype), torch.empty(k.shape, dtype=k.dtype)
    status = fn(q.data_ptr(), q.stride(0), heads, k.data_ptr(), k.stride(0), k.shape[1], cos.data_ptr(),
                signed_sin.data_ptr(), q_out.data_ptr(), k_out.data_ptr(), tokens, d, torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"rope rejected shapes q={tuple(q.shape)} k={tuple(k.shape)}")
    return q_out, k_out


def run_paged_decode_attention(fn, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                               sliding_window: int) -> torch.Tensor:
    """One query per sequence over the paged cache, read in place (no gather).

    q: (num_seqs, num_heads, head_dim) contiguous; caches (num_blocks, block_size,
    num_kv_heads, head_dim) contiguous; block_tables (num_seqs, blocks) int64 and seq_lens
    (num_seqs,) int64, contiguous. Returns (num_seqs, num_heads, head_dim).
    """
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    status = fn(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
                seq_lens.data_ptr(), out.data_ptr(), num_seqs, num_heads, num_kv_heads, head_dim,
                block_size, block_tables.shape[1], scale, sliding_window, torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"paged decode attention failed ({status}): q={tuple(q.shape)}, "
                           f"cache={tuple(k_cache.shape)}, tables={tuple(block_tables.shape)}")
    return out


def run_prefill_attention(fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                          block_table: torch.Tensor | None = None, context: int = 0) -> torch.Tensor:
    """Causal attention of a prompt chunk through ``native_prefill_attention``: q (n,
    num_heads, head_dim) with contiguous heads and any token stride (a view of a fused
    projection). Without ``block_table``: k and v (n, num_kv_heads, head_dim), the chunk's own
    keys, same layout. With it (int64, the sequence's blocks): k and v are the caches
    (num_blocks, block_size, num_kv_heads, head_dim), holding ``context`` earlier keys and
    the chunk's own, query i at position context + i. Returns (n, num_heads, head_dim)."""
    n, num_heads, head_dim = q.shape
    out = torch.empty((n, num_heads, head_dim), dtype=q.dtype)
    if block_table is None:
        num_kv_heads, k_stride, v_stride, table, block_size = k.shape[1], k.stride(0), v.stride(0), None, 0
    else:
        num_kv_heads, block_size = k.shape[2], k.shape[1]
        k_stride = v_stride = num_kv_heads * head_dim  # a cache slot
        table = block_table.data_ptr()
    status = fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), n, num_heads, num_kv_heads, head_dim,
                q.stride(0), k_stride, v_stride, table, block_size, context, scale, torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"prefill attention rejected q={tuple(q.shape)} k={tuple(k.shape)} context={context} "
                           f"(status {status})")
    return out


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` for (rows, vocab) float32 CPU logits, natively where the
    kernel runs (the same indices: first maximum, first NaN), else PyTorch's."""
    fn = build.native_argmax(logits.dtype)
    if fn is None or logits.dim() != 2 or logits.device.type != "cpu" or not logits.is_contiguous():
        return logits.argmax(dim=-1)
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    if fn(logits.data_ptr(), out.data_ptr(), logits.shape[0], logits.shape[1], torch.get_num_threads()) != 0:
        return logits.argmax(dim=-1)
    return out
