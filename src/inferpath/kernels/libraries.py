"""Build and load the C kernels' shared library of each instruction-set level (csrc/,
through ctypes), or say why it cannot run; and which level's library a kernel family
loads from.

Each level (isa.py) compiles its source directories with its own flags into one library.
csrc/drivers is compiled into every level: the level-independent C that drives the
level's kernels (the GEMV's entry points over one matrix or a group, the native decode
step and its thread pool).

A kernel family (float32, bfloat16, quantized) runs at the highest level at or below the
active one whose CPU flags are present and whose build succeeded (``resolve_level``): a
failed build of one level leaves the others standing. Builds are cached by a key over the
sources, the flags and the compiler's version (``library_build``), and time out. Loading
sets every exported function's ctypes signature, asks the kernel for the AMX tile state
where the CPU has AMX, and sets the K-quants' x passes from the environment.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from inferpath.kernels import isa
from inferpath.models import cache_dir

SOURCE_DIR = Path(__file__).with_name("csrc")
COMPILE_TIMEOUT_S = 240
COMMON_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")

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
    # float32 q and out over a bfloat16 cache (EngineConfig.kv_cache_dtype): as the f32 kernel
    "inferpath_paged_decode_attention_f32_kv_bf16": _SIGNATURES["inferpath_paged_decode_attention_{}"],
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
_AVX512_SIGNATURES = {"inferpath_amx_gemm_bf16": [_P] * 4 + [_I] * 3 + [_N], "inferpath_amx_init": []}
# q, k, v, out, n, heads, kv heads, head dim, q/k/v token strides, block table (or NULL),
# block size, context, scale, threads: csrc/avx512/prefill_attention.c and, for 256-bit
# registers, csrc/avx2/prefill_attention.c (the avx2 and avxvnni levels; the generic level,
# whose portable form of this kernel lost to PyTorch's SDPA, keeps SDPA)
_PREFILL_ATTENTION_LEVELS = ("avx2", "avxvnni", "avx512")
_PREFILL_ATTENTION_SIGNATURES = {f"inferpath_prefill_attention_{suffix}": [_P] * 4 + [_I] * 7 + [_P, _I, _I, _F, _N]
                                 for suffix in ("f32", "bf16", "f32_kv_bf16")}


def _compiler_version(compiler: str) -> str:
    result = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    return result.stdout.splitlines()[0] if result.stdout else compiler


def _library(level: str) -> tuple[ctypes.CDLL | None, str]:
    """(the compiled library of ``level``, "") or (None, why not). Built once per key."""
    loaded = isa._loaded.get(level)  # the per-step path: no lock once it is decided
    if loaded is not None:
        return loaded
    with isa._lock:
        if level in isa._loaded:
            return isa._loaded[level]
        lib, reason = None, ""
        try:
            lib, reason = _build(isa._LEVEL[level])
        except subprocess.TimeoutExpired as exc:
            reason = f"the compiler took more than {exc.timeout:.0f} s"
        except (OSError, AttributeError) as exc:  # unwritable cache, a library that will not load, ...
            reason = f"could not build or load the {level} kernels: {exc}"
        isa._loaded[level] = (lib, reason)
        return lib, reason


def _build(level: isa.Level) -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("INFERPATH_KERNELS", "1") == "0":
        return None, "disabled by INFERPATH_KERNELS=0"
    if not level.cpu_flags <= isa._cpu_flags():
        return None, f"this CPU lacks {', '.join(sorted(level.cpu_flags - isa._cpu_flags()))}"
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
    if level.name in _PREFILL_ATTENTION_LEVELS:
        signatures.update(_PREFILL_ATTENTION_SIGNATURES)
    for pattern, argtypes in _SIGNATURES.items():
        signatures.update({pattern.format(suffix): argtypes for suffix in _SUFFIX.values()})
    for symbol, argtypes in signatures.items():
        fn = getattr(lib, symbol)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    # the tile state, asked of the kernel (arch_prctl) only where the CPU has AMX; refused
    # (a kernel before Linux 5.16, a sandbox), the bf16 rows take the GEMV and oneDNN, the
    # quantized GEMM's panels its VNNI tiles
    probed = isa._probed_cpu_flags()
    granted = level.name == "avx512" and "amx_tile" in probed and lib.inferpath_amx_init() == 0
    lib.amx_ready = granted and isa.AMX_FLAGS <= probed
    lib.amx_int8_ready = granted and isa.AMX_INT8_FLAGS <= probed
    isa._set_amx_int8_engine(level.name, lib)
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


def resolve_level(family: str, level: str | None = None) -> tuple[str | None, str]:
    """(the level ``family`` runs at, why any higher one did not build) or (None, why none):
    the highest level at or below ``level`` (default ``active_level()``) that this CPU runs
    and that built."""
    level = level or isa.active_level()
    key = ("resolved", family, level)
    resolved = isa._loaded.get(key)  # the per-step path (``kernel_level``): one lookup
    if resolved is None:
        resolved = isa._loaded[key] = _resolve_level(family, level)
    return resolved


def _resolve_level(family: str, level: str) -> tuple[str | None, str]:
    top = isa.LEVEL_NAMES.index(level)
    reasons = []
    for name in reversed(isa.LEVEL_NAMES[:top + 1]):
        if not isa.can_run(name, family):
            continue
        lib, reason = _library(name)
        if lib is not None:
            return name, "; ".join(reasons)
        reasons.append(f"{name}: {reason}")
    return None, "; ".join(reasons) or "no level runs here"


def library_build(level: str | None = None) -> str:
    """Which build of ``level``'s library (default ``active_level()``) loads: the digest of
    its sources, flags and compiler in the cached file's name; "" where none builds."""
    lib, _ = _library(level or isa.active_level())
    return "" if lib is None else Path(lib._name).stem.rsplit("-", 1)[-1]
