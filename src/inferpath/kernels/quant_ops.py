"""Calls into the native quantized kernels (GGUF blocks read in place, csrc/quant): the
fused int8 kernels up to a row count per instruction-set level, dequantized float32 tiles
and PyTorch's GEMM past it. kernels/ops.py re-exports them, and the quantized modules
(quantized.py, groups.py, repacked.py, bf16_weights.py, decode_stack.py) call them by that name.

NOTE: the cutoffs and the tile size are read from this module: a test that changes them
patches ``quant_ops``, not ``ops``.
"""

from __future__ import annotations

import torch

from inferpath.kernels import build, workspace
from inferpath.kernels.dispatch_log import is_recording, note_dispatch
from inferpath.kernels.repacked import R8_BASE
from inferpath.model.batch_invariant import quant_call_flags, rows_must_be_invariant

# Up to this many rows (per instruction-set level) a quantized matmul runs the fused int8
# kernels (csrc/quant: the row kernel for a few rows, the wide kernel for tiles of 6+ (avx2),
# gemm.c's packed panels for 4+ rows at the avx512 level); past it, weight tiles are
# dequantized to float32 once and reused for all rows by PyTorch's GEMM. Measured on a
# 1536 x 576 Q4_1 weight, 1 thread, AMD EPYC (avx512 VNNI), ms fused vs tiled: avx512
# rows 32: 0.23 vs 1.38, 128: 0.68 vs 3.01, 512: 2.5 vs 9.4 (the GEMM kernel wins at every
# size: no cutoff); avx2 (maddubs) rows 32: 0.79 vs 1.43, 128: 3.17 vs 2.95, 512: 13.0 vs
# 9.4. The portable level's plain-C integer sums lose to the GEMM early. avxvnni (vpdpbusd
# on 256 bits; AMD EPYC Zen 5, 1 thread, 1536 x 576, ms fused vs tiled): Q4_0 rows 128
# 1.87 vs 2.20, 512 7.45 vs 8.77; Q5_1 128 2.50 vs 2.32, 512 8.90 vs 9.07; Q8_0 512 8.65
# vs 8.69 (avx2 the same run: Q8_0 512 11.6 vs 8.4): no cutoff there either.
QUANT_MATMUL_MAX_ROWS = {"generic": 32, "avx2": 96, "avxvnni": 1 << 62, "avx512": 1 << 62}


# Weights repacked by 8 rows (kernels/repacked.py) take the fused kernels at every row count
# where they are repacked: at avx2 r8.c's tiles beat dequantized tiles + GEMM at 512 rows,
# ms, AMD EPYC Zen 4, INFERPATH_ISA=avx2, 1 / 2 threads: Q4_K 8960 x 1536 107 vs 169 / 53
# vs 95, Q6_K 1536 x 8960 120 vs 155 / 82 vs 87 (the generic level repacks nothing).
R8_MATMUL_MAX_ROWS = {"generic": QUANT_MATMUL_MAX_ROWS["generic"], "avx2": 1 << 62, "avxvnni": 1 << 62,
                      "avx512": 1 << 62}


def quant_rows_fused(rows: int, level: str | None = None, repacked: bool = False) -> bool:
    """Whether ``rows`` rows of x take the fused quantized kernels (always when rows must
    be batch-invariant: rows are independent there), at ``level``: by default the one the
    quantized kernels run at (``build.kernel_level("quantized")``, a model's
    ``WeightPlan.kernel_level``), which is below ``active_level()`` where that level's
    build failed. ``repacked``: every weight of the call is repacked by 8 rows."""
    level = level or build.kernel_level("quantized") or "generic"
    limits = R8_MATMUL_MAX_ROWS if repacked else QUANT_MATMUL_MAX_ROWS
    return rows <= limits[level] or rows_must_be_invariant()


def quant_fused_kernel(rows: int, qtype: int) -> str:
    """Which fused kernel ``rows`` rows of x meet a weight of ``qtype`` through, as
    ``KernelChoice`` names it: "quant-rows" (each row alone), "quant-amx-int8" where the
    quantized GEMM's panels take the AMX-INT8 engine (``build.amx_int8_engine``: AMX tiles,
    or their reference where AMX is simulated; the C's own decision, asked of it:
    drivers/amx_int8_reference.c's AMX_INT8_MIN_ROWS and format allow-list), else
    "quant-fused"."""
    if rows_must_be_invariant():
        return "quant-rows"
    takes = build.native_amx_int8("takes") if build.amx_int8_engine() != "none" else None
    return "quant-amx-int8" if takes is not None and takes(qtype, rows) == 1 else "quant-fused"


DEQUANT_TILE_VALUES = 1 << 22  # 16 MB of float32 per dequantized weight tile


def run_quant_matmul(fn, x: torch.Tensor, data: torch.Tensor, qtype: int, bias: torch.Tensor | None,
                     num_out: int) -> torch.Tensor:
    """x (m, k) float32 contiguous @ the quantized weight's (num_out, k) transpose, + bias
    (num_out,) float32 or None, through ``native_quant_matmul``; data (num_out, row_bytes)."""
    if is_recording():
        note_dispatch(quant_fused_kernel(x.shape[0], qtype), x.shape[0])
    out = workspace.empty((x.shape[0], num_out), torch.float32)
    status = fn(qtype, data.data_ptr(), data.shape[1], x.data_ptr(), None if bias is None else bias.data_ptr(),
                out.data_ptr(), x.shape[0], num_out, x.shape[1], torch.get_num_threads(), quant_call_flags())
    if status != 0:
        raise RuntimeError(f"quantized matmul rejected x={tuple(x.shape)} weight rows={num_out} "
                           f"of {data.shape[1]} bytes, GGUF type {qtype} (status {status})")
    return out


def run_dequantize(fn, data: torch.Tensor, qtype: int, cols: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of a quantized weight, data (rows, row_bytes) contiguous -> (rows, cols) float32,
    into ``out`` (contiguous) where given."""
    if out is None:
        out = torch.empty((data.shape[0], cols), dtype=torch.float32)
    if fn(qtype, data.data_ptr(), data.shape[1], out.data_ptr(), data.shape[0], cols, torch.get_num_threads()) != 0:
        raise RuntimeError(f"dequantize rejected {tuple(data.shape)} bytes as {cols} values of GGUF type {qtype}")
    return out


def quantized_linear(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int, bias: torch.Tensor | None,
                     matmul_fn, dequantize_fn) -> torch.Tensor:
    """x (m, cols) float32 contiguous -> (m, rows) float32 against a quantized weight: the
    fused kernels (``quant_rows_fused``), else dequantized tiles and F.linear."""
    if quant_rows_fused(x.shape[0], repacked=qtype >= R8_BASE):
        return run_quant_matmul(matmul_fn, x, data, qtype, bias, data.shape[0])
    return dequantized_linear(x, [(data, qtype)], [bias], dequantize_fn)


def dequantized_linear(x: torch.Tensor, weights: list[tuple[torch.Tensor, int]], biases: list,
                       dequantize_fn) -> torch.Tensor:
    """x (m, cols) float32 against quantized weights whose outputs lie side by side
    (``(data (rows, row bytes), qtype)`` each, a float32 bias (rows,) or None each): their
    rows dequantized a float32 tile at a time and multiplied by PyTorch's GEMM. A tile may
    span weights, so a Q/K/V group is one GEMM, as a float model's fused projection is.
    A qtype of None: ``data`` is a float matrix (rows, cols), widened by a copy."""
    note_dispatch("quant-tiled", x.shape[0])
    cols = x.shape[1]
    starts = [0]
    for data, _ in weights:
        starts.append(starts[-1] + data.shape[0])
    num_out = starts[-1]
    tile_rows = max(8, DEQUANT_TILE_VALUES // cols // 8 * 8)  # whole groups of a repacked weight's 8 rows
    # NOTE: allocated only for several tiles: an unused output held beside F.linear's made
    # that one land on fresh pages (a 512 x 1536 prefill matmul, 2 threads: 7.3 -> 5.1 ms);
    # the output and the tiles come from kept buffers where large (kernels/workspace.py)
    out = workspace.empty((x.shape[0], num_out), torch.float32) if num_out > tile_rows else None
    for r0 in range(0, num_out, tile_rows):
        r1 = min(r0 + tile_rows, num_out)
        tile = workspace.empty((r1 - r0, cols), torch.float32)  # (rows, cols), every row written below
        bias = None if all(b is None for b in biases) else torch.zeros(r1 - r0)
        for (data, qtype), b, start, end in zip(weights, biases, starts, starts[1:]):
            lo, hi = max(start, r0), min(end, r1)
            if lo >= hi:
                continue
            rows = data[lo - start:hi - start]
            if qtype is None:
                tile[lo - r0:hi - r0] = rows
            else:  # straight into the tile's rows (contiguous)
                run_dequantize(dequantize_fn, rows, qtype, cols, out=tile[lo - r0:hi - r0])
            if b is not None:
                bias[lo - r0:hi - r0] = b[lo - start:hi - start]
        if r1 - r0 == num_out:  # one tile: no copy into out
            return torch.nn.functional.linear(x, tile, bias)
        out[:, r0:r1] = torch.nn.functional.linear(x, tile, bias)
    return out
