"""The native kernels' front door: each kernel's ctypes function by dtype (or family) and
level, or None where it cannot run, and the status line that says which ran and why.

Three modules make the native dispatch, lowest first:

- isa.py: the instruction-set levels (generic, avx2, avxvnni, avx512), the CPU flags the choices
  read (probed, or simulated by tests), the CPU's and the active level (``INFERPATH_ISA``),
  the AMX-INT8 engine the flags decide, and ``_loaded``, the dispatch's one cache;
- libraries.py: each level's shared library compiled (cached by a key over sources,
  flags and compiler) and loaded through ctypes, and the level each kernel family
  (float32, bfloat16, quantized) resolves to: the highest that runs here and built;
- build.py (this file): ``native_*(dtype)`` hands out a kernel's function from the library
  its family resolves to; ops.py calls them. The decode step of a float model is taken
  from the library its dtype's family runs at (``native_decode_layers(dtype)``), so that
  it calls that level's float kernels; a quantized model's from the quantized family's.

The names callers reach through ``build`` (levels, flags, ``simulated_cpu_flags``,
``resolve_level``, ``_library``, ...) are re-exported from isa.py and libraries.py below.
NOTE: a test that patches the dispatch's state patches it where it lives
(``isa._loaded``, ``isa._cpu_flags``, ``libraries.COMPILE_TIMEOUT_S``): patching the
re-exported name here would not reach the modules that read it.
"""

from __future__ import annotations

import os

import torch

from inferpath.kernels import isa, libraries
from inferpath.kernels.isa import (  # noqa: F401  (re-exported: callers and tests use build.*)
    AMX_FLAGS, AMX_INT8_ENGINES, AMX_INT8_FLAGS, FAMILIES, LEVEL_NAMES, LEVELS, Level, _LEVEL, _cpu_flags,
    _forget_decisions, _probed_cpu_flags, active_level, amx_int8_engine_for, can_run, cpu_flags, cpu_level,
    simulated_cpu_flags)
from inferpath.kernels.libraries import (  # noqa: F401  (re-exported, as above)
    COMMON_FLAGS, _library, library_build, resolve_level)

KERNEL_NAMES = {
    "float32": "gemv (float32 or bf16 weights), rms_norm, silu_mul, rope, paged decode attention, argmax, "
               "native decode",
    "bfloat16": "gemv, rms_norm, silu_mul, rope, paged decode attention, native decode",
    "quantized": "GGUF Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K matmul and dequantize, Q4_K/Q5_K/Q6_K/Q8_0/Q5_0/Q4_1 repacked by 8 rows",
}


def _family(dtype: torch.dtype | str) -> str:
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def _native(symbol: str, family: str, level: str | None = None):
    level = level or isa.active_level()
    key = (symbol, family, level)
    if key in isa._loaded:
        return isa._loaded[key]
    chosen, _ = libraries.resolve_level(family, level)
    fn = None if chosen is None else getattr(libraries._library(chosen)[0], symbol, None)
    isa._loaded[key] = fn
    return fn


def _dtype_kernel(pattern: str, dtype: torch.dtype, level: str | None):
    if dtype not in libraries._SUFFIX:
        return None
    return _native(pattern.format(libraries._SUFFIX[dtype]), _family(dtype), level)


def native_gemv(dtype: torch.dtype, level: str | None = None):
    """The native GEMV for ``dtype``, or None where it cannot run."""
    return _dtype_kernel("inferpath_gemv_{}", dtype, level)


def native_gemv_bf16_weights(level: str | None = None):
    """The GEMV of float32 x against bf16 weights (widened in the kernel: float32 family), or
    None where it cannot run."""
    return _native("inferpath_gemv_bf16_weights", "float32", level)


def native_gemv_group_bf16_weights(level: str | None = None):
    """``native_gemv_bf16_weights`` over a group of matrices sharing an input, or None."""
    return _native("inferpath_gemv_group_bf16_weights", "float32", level)


def native_amx_gemm(dtype: torch.dtype, level: str | None = None):
    """The AMX small-batch GEMM (bf16 only), or None where it cannot run: a level below
    avx512, no AMX, or the kernel refused this process the tile state. Where AMX is only
    simulated (``simulated_cpu_flags``): its portable reference, the same layout in C."""
    if (dtype != torch.bfloat16 or not AMX_FLAGS <= isa._cpu_flags()
            or libraries.resolve_level("bfloat16", level)[0] != "avx512"):
        return None
    lib = libraries._library("avx512")[0]
    if AMX_FLAGS <= isa._probed_cpu_flags():
        return lib.inferpath_amx_gemm_bf16 if lib.amx_ready else None
    return lib.inferpath_amx_reference_gemm_bf16


def amx_status() -> str:
    """Why the bf16 AMX GEMM runs or not, in words (for ``kernel_status``)."""
    if not AMX_FLAGS <= isa._cpu_flags():
        return f"no AMX GEMM: this CPU lacks {', '.join(sorted(AMX_FLAGS - isa._cpu_flags()))}"
    if not AMX_FLAGS <= isa._probed_cpu_flags():
        return "AMX GEMM simulated: its portable reference (csrc/drivers/amx_reference.c)"
    if not libraries._library("avx512")[0].amx_ready:
        return "no AMX GEMM: the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)"
    return "AMX GEMM"


def amx_int8_engine(level: str | None = None) -> str:
    """The engine the quantized GEMM's panels of ``AMX_INT8_MIN_ROWS`` rows or more take
    (``AMX_INT8_ENGINES``; drivers/amx_int8_tiles.h): "none" unless the quantized kernels
    run at avx512 (``level`` or the active one)."""
    if libraries.resolve_level("quantized", level)[0] != "avx512":
        return "none"
    return libraries._library("avx512")[0].amx_int8_engine


def amx_int8_status() -> str:
    """Why the quantized GEMM's AMX-INT8 engine runs or not, in words (``kernel_status``)."""
    engine = amx_int8_engine()
    if engine == "tiles":
        return "AMX-INT8 tiles"
    if engine == "reference":
        return "AMX-INT8 simulated: its portable reference (csrc/drivers/amx_int8_reference.c)"
    if not AMX_INT8_FLAGS <= isa._cpu_flags():  # before the switch: a CPU without AMX could not turn it on
        return f"no AMX-INT8: this CPU lacks {', '.join(sorted(AMX_INT8_FLAGS - isa._cpu_flags()))}"
    if os.environ.get("INFERPATH_AMX_INT8", "0") != "1":
        return "no AMX-INT8: off unless INFERPATH_AMX_INT8=1 (its tiles did not beat VNNI's)"
    if libraries.resolve_level("quantized")[0] != "avx512":
        return "no AMX-INT8: the quantized kernels run below the avx512 level"
    return "no AMX-INT8: the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)"


def native_amx_int8(symbol: str, level: str | None = None):
    """One of the AMX-INT8 engine's functions (``inferpath_amx_int8_*``: its tile multiply,
    gemm.c's panel packing, the panels served) from the quantized kernels' library, or None."""
    return _native(f"inferpath_amx_int8_{symbol}", "quantized", level)


def native_amx_reference_gemm(level: str | None = None):
    """The AMX GEMM's portable reference (same signature, layout and tile arithmetic,
    plain C; every level builds it), or None."""
    return _native("inferpath_amx_reference_gemm_bf16", "float32", level)


def native_amx_pack_x(level: str | None = None):
    """The AMX GEMM's packing of x^T into pair rows (csrc/drivers/amx_tiles.h), or None."""
    return _native("inferpath_amx_pack_x", "float32", level)


def native_rms_norm(dtype: torch.dtype, level: str | None = None):
    """The native RMSNorm for ``dtype``, or None."""
    return _dtype_kernel("inferpath_rms_norm_{}", dtype, level)


def native_silu_mul(dtype: torch.dtype, level: str | None = None):
    """The native SwiGLU gate for ``dtype``, or None."""
    return _dtype_kernel("inferpath_silu_mul_{}", dtype, level)


def native_rope(dtype: torch.dtype, level: str | None = None):
    """The native RoPE for ``dtype``, or None."""
    return _dtype_kernel("inferpath_rope_{}", dtype, level)


def native_paged_attention(dtype: torch.dtype, level: str | None = None, kv_dtype: torch.dtype | None = None):
    """The native paged decode attention for ``dtype`` queries over a ``kv_dtype`` cache (the
    same by default; float32 over bfloat16 too), or None."""
    if kv_dtype not in (None, dtype):
        return _mixed_kv_kernel("inferpath_paged_decode_attention_f32_kv_bf16", dtype, kv_dtype, level)
    return _dtype_kernel("inferpath_paged_decode_attention_{}", dtype, level)


def native_prefill_attention(dtype: torch.dtype, level: str | None = None, kv_dtype: torch.dtype | None = None):
    """The native causal prefill attention (a chunk over its own keys) for ``dtype`` queries
    over ``kv_dtype`` keys (as native_paged_attention), or None: built at the avx512 level
    (csrc/avx512/prefill_attention.c) and at avx2 and avxvnni (csrc/avx2/prefill_attention.c,
    the same kernel on 256-bit registers); the generic level keeps PyTorch's SDPA (its
    portable form of the kernel lost to it)."""
    if kv_dtype not in (None, dtype):
        return _mixed_kv_kernel("inferpath_prefill_attention_f32_kv_bf16", dtype, kv_dtype, level)
    return _dtype_kernel("inferpath_prefill_attention_{}", dtype, level)


def _mixed_kv_kernel(symbol: str, dtype: torch.dtype, kv_dtype: torch.dtype, level: str | None):
    """float32 queries over a bfloat16 cache (the float32 family's library), or None for any
    other pair"""
    if (dtype, kv_dtype) != (torch.float32, torch.bfloat16):
        return None
    return _native(symbol, "float32", level)


def native_argmax(dtype: torch.dtype, level: str | None = None):
    """The native argmax over rows (float32 logits only), or None."""
    return _native("inferpath_argmax_f32", "float32", level) if dtype == torch.float32 else None


def native_quant_matmul(level: str | None = None):
    """The fused dequantize-dot matmul over GGUF blocks (csrc/quant), or None."""
    return _native("inferpath_quant_matmul", "quantized", level)


def k_quant_x_passes(level: str | None = None, rows: int = 1, rows_alone: bool = False) -> int | None:
    """How many int8 passes of x the K-quant kernels at ``level`` meet in a call of ``rows``
    rows (by default: a decode step's rows 1 at avx512, 2 below; a prompt's, from
    ``k_quant_prompt_min_rows()`` rows and not ``rows_alone``, 1: csrc/quant/activations.h
    says why), or None without the quantized kernels."""
    fn = _native("inferpath_k_quant_x_passes", "quantized", level)
    return None if fn is None else int(fn(rows, int(rows_alone)))


def k_quant_prompt_min_rows(level: str | None = None) -> int | None:
    """The rows of x from which a call is prompt-sized (its own pass count), or None."""
    fn = _native("inferpath_k_quant_prompt_min_rows", "quantized", level)
    return None if fn is None else int(fn())


def set_k_quant_x_passes(passes: int, level: str | None = None, prompt: int | None = None) -> None:
    """Make the K-quant kernels at ``level`` meet x in ``passes`` (1 or 2) int8 passes from
    the next call on, and prompt-sized calls in ``prompt`` (by default ``passes`` too)
    (``INFERPATH_KQUANT_X_PASSES`` sets every level's at load, both counts;
    ``INFERPATH_KQUANT_PROMPT_X_PASSES`` the prompts' alone)."""
    fn = _native("inferpath_set_k_quant_x_passes", "quantized", level)
    if fn is None:
        raise RuntimeError(f"no quantized kernels at level {level or isa.active_level()!r}: {kernel_status()}")
    prompt = passes if prompt is None else prompt
    if fn(passes, prompt) != 0:
        bad = passes if passes not in (1, 2) else prompt
        raise ValueError(f"K-quant x passes must be 1 or 2, got {bad!r}")


def set_gemm_tile_rows(rows: int, level: str | None = None) -> int | None:
    """Make the GEMM panels at ``level`` (csrc/quant/gemm.c, avx512) take ``rows`` rows of x a
    tile from the next call on (1..6; 0: the core's default, 3 on AMD, else 6): the count
    before, or None where the level has no GEMM. Speed only: the results are the same bits."""
    fn = _native("inferpath_set_gemm_tile_rows", "quantized", level)
    before = None if fn is None else int(fn(rows))
    if before is not None and before < 0 and rows != 0 and not 1 <= rows <= 6:
        raise ValueError(f"GEMM tile rows must be 0..6, got {rows!r}")
    return before if before is None or before > 0 else None


def native_quant_matmul_group(level: str | None = None):
    """The fused dequantize-dot matmul of several weights against one x, or None."""
    return _native("inferpath_quant_matmul_group", "quantized", level)


def native_quant_dequantize(level: str | None = None):
    """The GGUF block dequantizer to float32 rows (csrc/quant), or None."""
    return _native("inferpath_quant_dequantize", "quantized", level)


def native_quant_repack(level: str | None = None):
    """The repacking of Q4_K / Q6_K rows into groups of eight (csrc/quant/r8.c), or None."""
    return _native("inferpath_quant_repack", "quantized", level)


def native_quant_repack_legacy(level: str | None = None):
    """The repacking of Q8_0 / Q5_0 rows into groups of eight (csrc/quant/r8_legacy.c), or None."""
    return _native("inferpath_quant_repack_legacy", "quantized", level)


def native_gemv_group(dtype: torch.dtype, level: str | None = None):
    """The native GEMV over a group of matrices sharing an input, or None."""
    return _dtype_kernel("inferpath_gemv_group_{}", dtype, level)


def native_decode_layers(family: torch.dtype | str = "quantized", level: str | None = None):
    """A decode step's Llama layers in one call (csrc/drivers/decode.c), from the library
    that ``family`` (a float dtype, or "quantized" for GGUF blocks) runs at, or None."""
    family = _family(family)
    return _native("inferpath_decode_layers", family, level) if family in FAMILIES else None


def native_decode_matmuls(family: torch.dtype | str = "quantized", level: str | None = None):
    """The native decode step's matmul over several weights of one shape, one after another
    (csrc/drivers/decode.c: what the probe times a call shape of the native step by), or None."""
    family = _family(family)
    return _native("inferpath_decode_matmuls", family, level) if family in FAMILIES else None


def gemv_available(dtype: torch.dtype) -> bool:
    """Whether the native kernels for ``dtype`` run on this machine."""
    return native_gemv(dtype) is not None


def kernel_level(family: torch.dtype | str) -> str | None:
    """The level a kernel family (a dtype, or "quantized") runs at now, or None (PyTorch)."""
    return libraries.resolve_level(_family(family))[0]


def kernel_status() -> str:
    """The level, then one line per kernel family: the level it runs at and the library,
    or PyTorch and why."""
    try:
        level = isa.active_level()
    except ValueError as exc:
        return f"kernels: PyTorch ({exc})"
    forced = os.environ.get("INFERPATH_ISA")
    lines = [f"ISA level: {level} (this CPU: {isa.cpu_level()}"
             + (f"; INFERPATH_ISA={forced})" if forced else ")")]
    for family in FAMILIES:
        chosen, reason = libraries.resolve_level(family, level)
        if chosen is None:
            lines.append(f"{family} {KERNEL_NAMES[family]}: PyTorch ({reason})")
            continue
        extra = ""
        if family == "bfloat16" and chosen == "avx512":
            amx = native_amx_gemm(torch.bfloat16, level) is not None
            extra = f" + {amx_status()}" if amx else f" ({amx_status()})"
        if family == "quantized" and chosen == "avx512":
            amx = amx_int8_engine(level) != "none"
            extra = f" + {amx_int8_status()}" if amx else f" ({amx_int8_status()})"
        failed = f"; {reason}" if reason else ""
        lines.append(f"{family} {KERNEL_NAMES[family]}{extra}: native {chosen} ({libraries._library(chosen)[0]._name}{failed})")
    return "\n".join(lines)
