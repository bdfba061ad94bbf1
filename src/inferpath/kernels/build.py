"""Build and load the C kernels (csrc/, through ctypes), or say why they cannot run.

``native_*(dtype)`` hands out a kernel's ctypes function, or None where it cannot run here;
ops.py holds the calls that use them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from functools import cache
from pathlib import Path

import torch

from inferpath.models import cache_dir

SOURCE_DIR = Path(__file__).with_name("csrc")
CFLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma", "-mamx-tile", "-mamx-bf16",
          "-fopenmp", "-shared", "-fPIC", "-lm"]
# CPU flags the kernels of each dtype need at run time; AMX_FLAGS for the AMX GEMM.
REQUIRED_FLAGS = {
    torch.float32: {"avx512f"},
    torch.bfloat16: {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"},
}
AMX_FLAGS = {"amx_tile", "amx_bf16"}
KERNEL_NAMES = "gemv, rms_norm, silu_mul, rope, paged decode attention, argmax"

_P, _I, _F, _N = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int  # pointer, size, float, threads
_SIGNATURES = {  # every exported function returns int: 0, or a negative error
    "inferpath_gemv_{}": [_P] * 4 + [_I] * 3 + [_N],
    "inferpath_rms_norm_{}": [_P] * 3 + [_I] * 2 + [_F, _N],
    "inferpath_silu_mul_{}": [_P, _I] * 3 + [_I] * 2 + [_N],
    "inferpath_rope_{}": [_P, _I, _I] * 2 + [_P] * 4 + [_I] * 2 + [_N],
    "inferpath_paged_decode_attention_{}": [_P] * 6 + [_I] * 6 + [_F, _I, _N],
}
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_EXTRA_SIGNATURES = {
    "inferpath_amx_gemm_bf16": [_P] * 4 + [_I] * 3 + [_N],
    "inferpath_argmax_f32": [_P] * 2 + [_I] * 2 + [_N],
    "inferpath_amx_init": [],
}

_lock = threading.Lock()
_loaded: dict[str, object] = {}


@cache
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _library() -> tuple[ctypes.CDLL | None, str]:
    """(the compiled library, "") or (None, why not). Built once per source and compiler."""
    loaded = _loaded.get("result")  # the per-step path: no lock once it is decided
    if loaded is not None:
        return loaded
    with _lock:
        if "result" in _loaded:
            return _loaded["result"]
        lib, reason = None, ""
        try:
            lib, reason = _build()
        except OSError as exc:  # unwritable cache, a library that will not load, ...
            reason = f"could not build or load the kernels: {exc}"
        _loaded["result"] = (lib, reason)
        return lib, reason


def _build() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("INFERPATH_KERNELS", "1") == "0":
        return None, "disabled by INFERPATH_KERNELS=0"
    if "avx512f" not in _cpu_flags():
        return None, "this CPU lacks avx512f"
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        return None, "no C compiler (gcc) found"
    sources = sorted(SOURCE_DIR.glob("*.c"))
    digest = hashlib.sha256(" ".join(CFLAGS).encode() + compiler.encode())
    for path in sorted(SOURCE_DIR.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    key = digest.hexdigest()[:16]
    target = cache_dir().parent / "kernels" / f"cpu_kernels-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            result = subprocess.run([compiler, *CFLAGS, *map(str, sources), "-o", str(built)],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                return None, f"{compiler} failed: {result.stderr.strip()[:500]}"
            os.replace(built, target)  # atomic: concurrent builders agree on one file
    lib = ctypes.CDLL(str(target))
    signatures = dict(_EXTRA_SIGNATURES)
    for pattern, argtypes in _SIGNATURES.items():
        signatures.update({pattern.format(suffix): argtypes for suffix in _SUFFIX.values()})
    for symbol, argtypes in signatures.items():
        fn = getattr(lib, symbol)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    lib.amx_ready = AMX_FLAGS <= _cpu_flags() and lib.inferpath_amx_init() == 0  # tile state granted
    return lib, ""


def _native(pattern: str, dtype: torch.dtype):
    if dtype not in _SUFFIX or not REQUIRED_FLAGS[dtype] <= _cpu_flags():
        return None
    lib = _library()[0]
    return None if lib is None else getattr(lib, pattern.format(_SUFFIX[dtype]), None)


def native_gemv(dtype: torch.dtype):
    """The native GEMV for ``dtype``, or None where it cannot run."""
    return _native("inferpath_gemv_{}", dtype)


def native_amx_gemm(dtype: torch.dtype):
    """The AMX small-batch GEMM (bf16 only), or None where it cannot run: no AMX, or the
    kernel refused this process the tile state."""
    fn = _native("inferpath_amx_gemm_{}", dtype) if dtype == torch.bfloat16 else None
    return fn if fn is not None and _library()[0].amx_ready else None


def native_rms_norm(dtype: torch.dtype):
    """The native RMSNorm for ``dtype``, or None."""
    return _native("inferpath_rms_norm_{}", dtype)


def native_silu_mul(dtype: torch.dtype):
    """The native SwiGLU gate for ``dtype``, or None."""
    return _native("inferpath_silu_mul_{}", dtype)


def native_rope(dtype: torch.dtype):
    """The native RoPE for ``dtype``, or None."""
    return _native("inferpath_rope_{}", dtype)


def native_paged_attention(dtype: torch.dtype):
    """The native paged decode attention for ``dtype``, or None."""
    return _native("inferpath_paged_decode_attention_{}", dtype)


def native_argmax(dtype: torch.dtype):
    """The native argmax over rows (float32 logits only), or None."""
    return _native("inferpath_argmax_{}", dtype) if dtype == torch.float32 else None


def gemv_available(dtype: torch.dtype) -> bool:
    """Whether the native kernels for ``dtype`` run on this machine."""
    return native_gemv(dtype) is not None


def kernel_status() -> str:
    """One line per dtype: whether the native kernels run here, and why not when not."""
    lib, reason = _library()
    lines = []
    for dtype in _SUFFIX:
        name = str(dtype).removeprefix("torch.")
        missing = REQUIRED_FLAGS[dtype] - _cpu_flags()
        if lib is None:
            lines.append(f"{KERNEL_NAMES} {name}: PyTorch ({reason})")
        elif missing:
            lines.append(f"{KERNEL_NAMES} {name}: PyTorch (this CPU lacks {', '.join(sorted(missing))})")
        else:
            amx = " + AMX GEMM" if dtype == torch.bfloat16 and native_amx_gemm(dtype) is not None else ""
            lines.append(f"{KERNEL_NAMES}{amx} {name}: native ({lib._name})")
    return "\n".join(lines)
