"""Build and load the C kernels per instruction-set level (csrc/, through ctypes), or say
why they cannot run.

Three levels, each its own shared library built from one source set with its own flags:

- ``generic``: portable C (csrc/portable, csrc/quant), no intrinsics, vectorised by the
  compiler; every CPU runs it (and it is what an aarch64 machine compiles);
- ``avx2``: the same sources with ``-mavx2 -mfma -mf16c`` (AMD Zen 2/3, Intel client
  CPUs); the quantized dot products take their AVX2 branch (maddubs/madd);
- ``avx512``: csrc/avx512 (intrinsics; AMX for bf16 where the CPU has it) and csrc/quant
  with VNNI (its GEMM's panels through AMX-INT8 tiles where the CPU has them:
  ``amx_int8_engine``).

csrc/drivers is compiled into every level: the level-independent C that drives the
level's kernels (the GEMV's entry points over one matrix or a group, the native decode
step and its thread pool). The decode step of a float model is taken from the library its
dtype's family runs at (``native_decode_layers(dtype)``), so that it calls that level's
float kernels; a quantized model's from the quantized family's.

The level is the best the CPU reports (/proc/cpuinfo), or a lower one forced with
``INFERPATH_ISA=generic|avx2|avx512``. A kernel family (float32, bfloat16, quantized)
runs at the highest level at or below that whose CPU flags are present and whose build
succeeded: a failed build of one level leaves the others standing. Builds are cached by
a key over the sources, the flags and the compiler's version, and time out.
``native_*(dtype)`` hands out a kernel's ctypes function, or None; ops.py calls them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from inferpath.models import cache_dir

SOURCE_DIR = Path(__file__).with_name("csrc")
COMPILE_TIMEOUT_S = 240
COMMON_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")


@dataclass(frozen=True)
class Level:
    """One instruction-set level: its sources, compiler flags and the CPU flags it needs."""

    name: str
    source_dirs: tuple[str, ...]
    flags: tuple[str, ...]
    cpu_flags: frozenset[str]


LEVELS = (  # lowest first
    Level("generic", ("portable", "quant", "drivers"), (), frozenset()),
    Level("avx2", ("portable", "quant", "drivers"), ("-mavx2", "-mfma", "-mf16c"), frozenset({"avx2", "fma", "f16c"})),
    Level("avx512", ("avx512", "quant", "drivers"),
          ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni", "-mfma", "-mf16c",
           "-mamx-tile", "-mamx-bf16", "-mamx-int8"),
          frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"})),
)
LEVEL_NAMES = tuple(level.name for level in LEVELS)
_LEVEL = {level.name: level for level in LEVELS}
# Kernel families and the CPU flags each needs beyond its level's (avx512 bf16: vdpbf16ps).
FAMILIES = ("float32", "bfloat16", "quantized")
_FAMILY_FLAGS = {("avx512", "bfloat16"): frozenset({"avx512_bf16"})}
AMX_FLAGS = frozenset({"amx_tile", "amx_bf16"})  # the bf16 AMX GEMM's (csrc/avx512/amx.c)
AMX_INT8_FLAGS = frozenset({"amx_tile", "amx_int8"})  # the quantized GEMM's AMX-INT8 engine (avx512/amx_int8.c)
AMX_INT8_ENGINES = ("none", "reference", "tiles")  # drivers/amx_int8_tiles.h's AMX_INT8_NONE, _REFERENCE, _TILES
KERNEL_NAMES = {
    "float32": "gemv (float32 or bf16 weights), rms_norm, silu_mul, rope, paged decode attention, argmax, "
               "native decode",
    "bfloat16": "gemv, rms_norm, silu_mul, rope, paged decode attention, native decode",
    "quantized": "GGUF Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K matmul and dequantize, Q4_K/Q5_K/Q6_K/Q8_0/Q5_0/Q4_1 repacked by 8 rows",
}

_P, _I, _F, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int  # pointer, size, float, threads
_SIGNATURES = {  # every exported function returns int: 0, or a negative error
    "inferpath_gemv_{}": [_P] * 4 + [_I] * 3 + [_N],
    # count, weights[], rows[], biases[], x, y, m, k, threads
    "inferpath_gemv_group_{}": [_N] + [_P] * 5 + [_I] * 2 + [_N],
    "inferpath_rms_norm_{}": [_P] * 3 + [_I] * 2 + [_F, _N],
    "inferpath_silu_mul_{}": [_P, _I] * 3 + [_I] * 2 + [_N],
    "inferpath_rope_{}": [_P, _I, _I] * 2 + [_P] * 4 + [_I] * 2 + [_N],
    "inferpath_paged_decode_attention_{}": [_P] * 6 + [_I] * 6 + [_F, _I, _N],
}
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_EXTRA_SIGNATURES = {
    "inferpath_argmax_f32": [_P] * 2 + [_I] * 2 + [_N],
    "inferpath_k_quant_x_passes": [_I, _N],
    "inferpath_k_quant_prompt_min_rows": [],
    "inferpath_set_k_quant_x_passes": [_N, _N],
    # bf16 weights, float32 x / bias / y: as inferpath_gemv_{} and inferpath_gemv_group_{}
    "inferpath_gemv_bf16_weights": _SIGNATURES["inferpath_gemv_{}"],
    "inferpath_gemv_group_bf16_weights": _SIGNATURES["inferpath_gemv_group_{}"],
    # qtype, weight, row bytes, x (f32), bias (f32 or NULL), y (f32), m, n, k, threads, rows alone
    "inferpath_quant_matmul": [_N, _P, _I, _P, _P, _P, _I, _I, _I, _N, _N],
    # count, qtypes[], weights[], row bytes[], rows[], biases[], x, y, m, k, threads, rows alone
    "inferpath_quant_matmul_group": [_N] + [_P] * 7 + [_I, _I, _N, _N],
    # count, qtype, weights[], row bytes, rows, x, y, m, k, threads, rows alone, activations' type
    # (csrc/drivers/decode.c: the native step's matmuls, as the probe times them)
    "inferpath_decode_matmuls": [_N, _N, _P, _I, _I, _P, _P, _I, _I, _N, _N, _N],
    # qtype, weight, row bytes, out (f32), rows, k, threads
    "inferpath_quant_dequantize": [_N, _P, _I, _P, _I, _I, _N],
    # GGUF qtype (Q4_K, Q6_K), weight, row bytes, rows, k, out (repacked: csrc/quant/r8.h), threads
    "inferpath_quant_repack": [_N, _P, _I, _I, _I, _P, _N],
    # the same for Q8_0 / Q5_0 (csrc/quant/r8_legacy.c)
    "inferpath_quant_repack_legacy": [_N, _P, _I, _I, _I, _P, _N],
    # layers, count, shape, x, m, cos, sin, slots, rows (decode rows and chunks), threads, rows alone,
    # stage seconds (or NULL)
    "inferpath_decode_layers": [_P, _N, _P, _P, _I, _P, _P, _P, _P, _N, _N, _P],
    # the AMX GEMM's layout in plain C (csrc/drivers/amx_reference.c): as inferpath_amx_gemm_bf16;
    # x, k, rows, xp
    "inferpath_amx_reference_gemm_bf16": [_P] * 4 + [_I] * 3 + [_N],
    "inferpath_amx_pack_x": [_P, _I, _I, _P],
    # the quantized GEMM's AMX-INT8 engine (csrc/drivers/amx_int8_reference.c): engine; qtype, rows;
    # panels served; c, a, a stride, b, b stride, rows, k bytes (TDPBSUD on one tile)
    "inferpath_amx_int8_use": [_N], "inferpath_amx_int8_takes": [_N, _I], "inferpath_amx_int8_panels": [],
    "inferpath_amx_int8_tile_dpbsud": [_P, _P, _I, _P, _I, _N, _N],
    # qtype, weight, row bytes, columns, k, panel (csrc/quant/gemm.c: -1 below the avx512 level)
    "inferpath_amx_int8_pack_panel": [_N, _P, _I, _N, _I, _P],
}
_AVX512_SIGNATURES = {
    "inferpath_amx_gemm_bf16": [_P] * 4 + [_I] * 3 + [_N], "inferpath_amx_init": [],
    # q, k, v, out, n, heads, kv heads, head dim, q/k/v token strides, block table (or NULL),
    # block size, context, scale, threads (the portable form of this kernel lost to
    # PyTorch's SDPA: the lower levels keep SDPA)
    **{f"inferpath_prefill_attention_{suffix}": [_P] * 4 + [_I] * 7 + [_P, _I, _I, _F, _N]
       for suffix in ("f32", "bf16")},
}

_lock = threading.Lock()
_loaded: dict = {}  # level name -> (library or None, reason); (pattern, family, level) -> resolved fn


@cache
def _probed_cpu_flags() -> frozenset[str]:
    """The flags /proc/cpuinfo reports: what this CPU executes."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


_simulated_flags: frozenset[str] | None = None  # set by simulated_cpu_flags


def _cpu_flags() -> frozenset[str]:
    """The CPU flags the kernels' choices read: the probed ones, or those a test simulates."""
    return _probed_cpu_flags() if _simulated_flags is None else _simulated_flags


def cpu_flags() -> frozenset[str]:
    """The CPU flags the dispatch decides on (see ``simulated_cpu_flags``)."""
    return _cpu_flags()


@contextmanager
def simulated_cpu_flags(add=(), remove=()):
    """Decide as if this CPU reported ``add`` and lacked ``remove`` (tests: the AMX dispatch
    on a CPU without AMX, the AVX-512-without-AMX one on a CPU with it). Only AMX flags may
    be added, and an added AMX flag the CPU lacks gives the portable reference of the AMX
    GEMM (``native_amx_gemm``), and of the quantized GEMM's AMX-INT8 engine
    (``amx_int8_engine``): no instruction this CPU lacks ever runs. Choices made
    inside (kernel lookups, a model's prepared kernels) belong to the simulation.

    Raises ValueError for an added flag that is not an AMX one."""
    global _simulated_flags
    added, removed = frozenset(add), frozenset(remove)
    if any(not flag.startswith("amx") for flag in added):
        raise ValueError(f"simulated_cpu_flags adds only AMX flags (amx_tile, amx_bf16, amx_int8), not "
                         f"{sorted(f for f in added if not f.startswith('amx'))}: a level's flags the CPU "
                         f"lacks would run instructions it cannot execute; remove flags instead")
    previous = _simulated_flags
    _simulated_flags = (_cpu_flags() | added) - removed
    _forget_decisions()
    try:
        yield _simulated_flags
    finally:
        _simulated_flags = previous
        _forget_decisions()


def amx_int8_engine_for(flags: frozenset[str], probed: frozenset[str], tiles_granted: bool,
                        enabled: bool) -> str:
    """Which engine serves the quantized GEMM's panels (one of ``AMX_INT8_ENGINES``) at the
    avx512 level, for the CPU flags the dispatch decides on (``flags``), those the CPU
    really has (``probed``), whether the kernel granted the AMX tile state, and whether
    INFERPATH_AMX_INT8=1 asked for it (``enabled``: off by default, since the tiles did not
    beat the VNNI tiles, docs/amx.md): "tiles" only on a CPU with amx_tile and amx_int8
    that was granted it, "reference" (plain C, the same layout and results) where the
    AMX-INT8 flags are only simulated, else "none"."""
    if not enabled or not AMX_INT8_FLAGS <= flags:
        return "none"
    if AMX_INT8_FLAGS <= probed:
        return "tiles" if tiles_granted else "none"
    return "reference"


def _set_amx_int8_engine(level: str, lib) -> None:
    """Tell the avx512 library which AMX-INT8 engine the flags decide (none elsewhere)."""
    if level != "avx512":
        return
    engine = amx_int8_engine_for(_cpu_flags(), _probed_cpu_flags(), lib.amx_int8_ready,
                                 os.environ.get("INFERPATH_AMX_INT8", "0") == "1")
    if lib.inferpath_amx_int8_use(AMX_INT8_ENGINES.index(engine)) != 0:
        raise RuntimeError(f"the avx512 kernels refused the AMX-INT8 engine {engine!r}")
    lib.amx_int8_engine = engine


def _forget_decisions() -> None:
    """Drop the choices made from the CPU flags (levels, resolved functions), keeping the
    built libraries, and set the avx512 library's AMX-INT8 engine anew."""
    with _lock:
        for key in [key for key in _loaded if key not in _LEVEL]:
            del _loaded[key]
        lib = _loaded.get("avx512", (None, ""))[0]
    if lib is not None:
        _set_amx_int8_engine("avx512", lib)


def cpu_level() -> str:
    """The best level this CPU can run."""
    if "cpu_level" not in _loaded:
        _loaded["cpu_level"] = [level.name for level in LEVELS if level.cpu_flags <= _cpu_flags()][-1]
    return _loaded["cpu_level"]


def active_level() -> str:
    """The level kernels are chosen at: ``cpu_level()``, or lower if INFERPATH_ISA says so.

    Raises ValueError for an INFERPATH_ISA that names no level.
    """
    forced = os.environ.get("INFERPATH_ISA", "")
    level = _loaded.get(("active", forced))  # the per-step path: one lookup
    if level is None:
        name, best = forced.strip().lower(), cpu_level()
        if name and name not in _LEVEL:
            raise ValueError(f"INFERPATH_ISA={forced!r} names no instruction-set level; "
                             f"use one of {', '.join(LEVEL_NAMES)}")
        level = min(name, best, key=LEVEL_NAMES.index) if name else best  # never above the CPU's
        _loaded[("active", forced)] = level
    return level


def can_run(level: str, family: str | None = None) -> bool:
    """Whether this CPU has the flags ``level`` (and ``family`` at that level) needs."""
    needed = _LEVEL[level].cpu_flags | _FAMILY_FLAGS.get((level, family), frozenset())
    return needed <= _cpu_flags()


def _compiler_version(compiler: str) -> str:
    result = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    return result.stdout.splitlines()[0] if result.stdout else compiler


def _library(level: str) -> tuple[ctypes.CDLL | None, str]:
    """(the compiled library of ``level``, "") or (None, why not). Built once per key."""
    loaded = _loaded.get(level)  # the per-step path: no lock once it is decided
    if loaded is not None:
        return loaded
    with _lock:
        if level in _loaded:
            return _loaded[level]
        lib, reason = None, ""
        try:
            lib, reason = _build(_LEVEL[level])
        except subprocess.TimeoutExpired as exc:
            reason = f"the compiler took more than {exc.timeout:.0f} s"
        except (OSError, AttributeError) as exc:  # unwritable cache, a library that will not load, ...
            reason = f"could not build or load the {level} kernels: {exc}"
        _loaded[level] = (lib, reason)
        return lib, reason


def _build(level: Level) -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("INFERPATH_KERNELS", "1") == "0":
        return None, "disabled by INFERPATH_KERNELS=0"
    if not level.cpu_flags <= _cpu_flags():
        return None, f"this CPU lacks {', '.join(sorted(level.cpu_flags - _cpu_flags()))}"
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        return None, "no C compiler (gcc) found"
    flags = [*COMMON_FLAGS, *level.flags]
    files = sorted(p for name in level.source_dirs for p in (SOURCE_DIR / name).iterdir())
    digest = hashlib.sha256("\0".join([_compiler_version(compiler), compiler, *flags]).encode())
    for path in files:
        digest.update(str(path.relative_to(SOURCE_DIR)).encode() + path.read_bytes())
    target = cache_dir().parent / "kernels" / f"cpu_kernels-{level.name}-{digest.hexdigest()[:16]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        sources = [str(p) for p in files if p.suffix == ".c"]
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            result = subprocess.run([compiler, *flags, *sources, "-o", str(built), "-lm"],
                                    capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
            if result.returncode != 0:
                return None, f"{compiler} failed: {result.stderr.strip()[:500]}"
            os.replace(built, target)  # atomic: concurrent builders agree on one file
    lib = ctypes.CDLL(str(target))
    signatures = dict(_EXTRA_SIGNATURES)
    if level.name == "avx512":
        signatures.update(_AVX512_SIGNATURES)
    for pattern, argtypes in _SIGNATURES.items():
        signatures.update({pattern.format(suffix): argtypes for suffix in _SUFFIX.values()})
    for symbol, argtypes in signatures.items():
        fn = getattr(lib, symbol)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    # the tile state, asked of the kernel (arch_prctl) only where the CPU has AMX; refused
    # (a kernel before Linux 5.16, a sandbox), the bf16 rows take the GEMV and oneDNN, the
    # quantized GEMM's panels its VNNI tiles
    probed = _probed_cpu_flags()
    granted = level.name == "avx512" and "amx_tile" in probed and lib.inferpath_amx_init() == 0
    lib.amx_ready = granted and AMX_FLAGS <= probed
    lib.amx_int8_ready = granted and AMX_INT8_FLAGS <= probed
    _set_amx_int8_engine(level.name, lib)
    every, prompts = (_passes_from_env(name) for name in ("INFERPATH_KQUANT_X_PASSES", "INFERPATH_KQUANT_PROMPT_X_PASSES"))
    decode = every or lib.inferpath_k_quant_x_passes(1, 0)
    prompt = prompts or every or lib.inferpath_k_quant_x_passes(lib.inferpath_k_quant_prompt_min_rows(), 0)
    lib.inferpath_set_k_quant_x_passes(decode, prompt)
    return lib, ""


def _passes_from_env(name: str) -> int | None:
    """The K-quants' x passes ``name`` sets (1 or 2), or None where it is unset."""
    passes = os.environ.get(name, "")
    if passes and passes not in ("1", "2"):
        raise ValueError(f"{name} must be 1 or 2, got {passes!r}")
    return int(passes) if passes else None


def _family(dtype: torch.dtype | str) -> str:
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def resolve_level(family: str, level: str | None = None) -> tuple[str | None, str]:
    """(the level ``family`` runs at, why any higher one did not build) or (None, why none):
    the highest level at or below ``level`` (default ``active_level()``) that this CPU runs
    and that built."""
    level = level or active_level()
    key = ("resolved", family, level)
    resolved = _loaded.get(key)  # the per-step path (``kernel_level``): one lookup
    if resolved is None:
        resolved = _loaded[key] = _resolve_level(family, level)
    return resolved


def _resolve_level(family: str, level: str) -> tuple[str | None, str]:
    top = LEVEL_NAMES.index(level)
    reasons = []
    for name in reversed(LEVEL_NAMES[:top + 1]):
        if not can_run(name, family):
            continue
        lib, reason = _library(name)
        if lib is not None:
            return name, "; ".join(reasons)
        reasons.append(f"{name}: {reason}")
    return None, "; ".join(reasons) or "no level runs here"


def _native(symbol: str, family: str, level: str | None = None):
    level = level or active_level()
    key = (symbol, family, level)
    if key in _loaded:
        return _loaded[key]
    chosen, _ = resolve_level(family, level)
    fn = None if chosen is None else getattr(_library(chosen)[0], symbol, None)
    _loaded[key] = fn
    return fn


def _dtype_kernel(pattern: str, dtype: torch.dtype, level: str | None):
    if dtype not in _SUFFIX:
        return None
    return _native(pattern.format(_SUFFIX[dtype]), _family(dtype), level)


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
    if (dtype != torch.bfloat16 or not AMX_FLAGS <= _cpu_flags()
            or resolve_level("bfloat16", level)[0] != "avx512"):
        return None
    lib = _library("avx512")[0]
    if AMX_FLAGS <= _probed_cpu_flags():
        return lib.inferpath_amx_gemm_bf16 if lib.amx_ready else None
    return lib.inferpath_amx_reference_gemm_bf16


def amx_status() -> str:
    """Why the bf16 AMX GEMM runs or not, in words (for ``kernel_status``)."""
    if not AMX_FLAGS <= _cpu_flags():
        return f"no AMX GEMM: this CPU lacks {', '.join(sorted(AMX_FLAGS - _cpu_flags()))}"
    if not AMX_FLAGS <= _probed_cpu_flags():
        return "AMX GEMM simulated: its portable reference (csrc/drivers/amx_reference.c)"
    if not _library("avx512")[0].amx_ready:
        return "no AMX GEMM: the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)"
    return "AMX GEMM"


def amx_int8_engine(level: str | None = None) -> str:
    """The engine the quantized GEMM's panels of ``AMX_INT8_MIN_ROWS`` rows or more take
    (``AMX_INT8_ENGINES``; drivers/amx_int8_tiles.h): "none" unless the quantized kernels
    run at avx512 (``level`` or the active one)."""
    if resolve_level("quantized", level)[0] != "avx512":
        return "none"
    return _library("avx512")[0].amx_int8_engine


def amx_int8_status() -> str:
    """Why the quantized GEMM's AMX-INT8 engine runs or not, in words (``kernel_status``)."""
    engine = amx_int8_engine()
    if engine == "none" and os.environ.get("INFERPATH_AMX_INT8", "0") != "1":
        return "no AMX-INT8: off unless INFERPATH_AMX_INT8=1 (its tiles did not beat VNNI's)"
    if engine == "tiles":
        return "AMX-INT8 tiles"
    if engine == "reference":
        return "AMX-INT8 simulated: its portable reference (csrc/drivers/amx_int8_reference.c)"
    if not AMX_INT8_FLAGS <= _cpu_flags():
        return f"no AMX-INT8: this CPU lacks {', '.join(sorted(AMX_INT8_FLAGS - _cpu_flags()))}"
    if resolve_level("quantized")[0] != "avx512":
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


def native_paged_attention(dtype: torch.dtype, level: str | None = None):
    """The native paged decode attention for ``dtype``, or None."""
    return _dtype_kernel("inferpath_paged_decode_attention_{}", dtype, level)


def native_prefill_attention(dtype: torch.dtype, level: str | None = None):
    """The native causal prefill attention (a chunk over its own keys) for ``dtype``, or None
    (the avx512 level only: below it PyTorch's SDPA was faster)."""
    return _dtype_kernel("inferpath_prefill_attention_{}", dtype, level)


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
        raise RuntimeError(f"no quantized kernels at level {level or active_level()!r}: {kernel_status()}")
    prompt = passes if prompt is None else prompt
    if fn(passes, prompt) != 0:
        bad = passes if passes not in (1, 2) else prompt
        raise ValueError(f"K-quant x passes must be 1 or 2, got {bad!r}")


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


def library_build(level: str | None = None) -> str:
    """Which build of ``level``'s library (default ``active_level()``) loads: the digest of
    its sources, flags and compiler in the cached file's name; "" where none builds."""
    lib, _ = _library(level or active_level())
    return "" if lib is None else Path(lib._name).stem.rsplit("-", 1)[-1]


def kernel_level(family: torch.dtype | str) -> str | None:
    """The level a kernel family (a dtype, or "quantized") runs at now, or None (PyTorch)."""
    return resolve_level(_family(family))[0]


def kernel_status() -> str:
    """The level, then one line per kernel family: the level it runs at and the library,
    or PyTorch and why."""
    try:
        level = active_level()
    except ValueError as exc:
        return f"kernels: PyTorch ({exc})"
    forced = os.environ.get("INFERPATH_ISA")
    lines = [f"ISA level: {level} (this CPU: {cpu_level()}"
             + (f"; INFERPATH_ISA={forced})" if forced else ")")]
    for family in FAMILIES:
        chosen, reason = resolve_level(family, level)
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
        lines.append(f"{family} {KERNEL_NAMES[family]}{extra}: native {chosen} ({_library(chosen)[0]._name}{failed})")
    return "\n".join(lines)
