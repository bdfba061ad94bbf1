"""Build and load the C kernels (csrc/, through ctypes), or say why they cannot run."""

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
# CPU flags each kernel needs at run time.
REQUIRED_FLAGS = {
    torch.float32: {"avx512f"},
    torch.bfloat16: {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"},
}
_GEMV_SYMBOLS = {torch.float32: "inferpath_gemv_f32", torch.bfloat16: "inferpath_gemv_bf16"}
_NORM_SYMBOLS = {torch.float32: "inferpath_rms_norm_f32", torch.bfloat16: "inferpath_rms_norm_bf16"}
_SILU_SYMBOLS = {torch.float32: "inferpath_silu_mul_f32", torch.bfloat16: "inferpath_silu_mul_bf16"}
_ARGMAX_SYMBOLS = {torch.float32: "inferpath_argmax_f32"}
_ROPE_SYMBOLS = {torch.float32: "inferpath_rope_f32", torch.bfloat16: "inferpath_rope_bf16"}
AMX_FLAGS = {"amx_tile", "amx_bf16"}
# The attention kernel's register arrays (csrc/attention.c MAX_HEAD_DIM, MAX_GROUP): larger
# heads or query groups take PyTorch's SDPA.
ATTENTION_MAX_HEAD_DIM = 256
ATTENTION_MAX_GROUP = 16
# bf16 rows up to which the AMX kernel beats oneDNN (it reads the weights once per 64
# rows). Measured like GEMV_MAX_ROWS, AMX vs PyTorch in ms: rows 1: 14 vs 31, 8: 16 vs 33,
# 32: 15 vs 27, 64: 24 vs 34, 96: 41 vs 46, 128: 57 vs 64, 192: 88 vs 92.
AMX_MAX_ROWS = 128
AMX_MIN_ROWS = 2  # one row: the GEMV is as fast (engine A/B below)
_ATTENTION_SYMBOLS = {torch.float32: "inferpath_paged_decode_attention_f32",
                      torch.bfloat16: "inferpath_paged_decode_attention_bf16"}
# The C GEMV takes any number of rows (in groups of 4: after the first group each block of
# weights is re-read from L1, not memory), but past some rows it is compute-bound and
# PyTorch's GEMM (MKL for fp32; for bf16 the AMX kernel below, else oneDNN) wins. The
# dispatcher's cutoffs, measured on the 2-core AVX512 VM over one decode step's SmolLM2
# matrices (fused, weights not in cache), kernel vs PyTorch in ms: fp32 rows 4: 21 vs 36,
# 8: 29 vs 46, 16: 40 vs 54, 32: 66 vs 74, 64: 96 vs 79; bf16 rows 1: 16 vs 38, 4: 13 vs
# 19, 8: 22 vs 22, 16: 36 vs 22.
KERNEL_ROWS = 1 << 30
GEMV_MAX_ROWS = {torch.float32: 32, torch.bfloat16: 8}
MAX_ROWS = max(GEMV_MAX_ROWS.values())

KERNEL_NAMES = "gemv, rms_norm, silu_mul, rope, paged decode attention, argmax"

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
    with _lock:
        if "lib" in _loaded:
            return _loaded["lib"], _loaded["reason"]
        lib, reason = None, ""
        try:
            lib, reason = _build()
        except OSError as exc:  # unwritable cache, a library that will not load, ...
            reason = f"could not build or load the kernels: {exc}"
        _loaded.update(lib=lib, reason=reason)
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
    for symbol in _GEMV_SYMBOLS.values():
        fn = getattr(lib, symbol)
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        fn.restype = ctypes.c_int
    for symbol in _NORM_SYMBOLS.values():
        fn = getattr(lib, symbol)
        fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float, ctypes.c_int]
        fn.restype = ctypes.c_int
    lib.inferpath_amx_gemm_bf16.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.inferpath_amx_gemm_bf16.restype = ctypes.c_int
    lib.inferpath_amx_init.restype = ctypes.c_int
    lib.amx_ready = AMX_FLAGS <= _cpu_flags() and lib.inferpath_amx_init() == 0  # tile state granted
    for symbol in _ROPE_SYMBOLS.values():
        fn = getattr(lib, symbol)
        fn.argtypes = ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] * 2 + [ctypes.c_void_p] * 4
                       + [ctypes.c_int64] * 2 + [ctypes.c_int])
        fn.restype = ctypes.c_int
    lib.inferpath_argmax_f32.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_int]
    lib.inferpath_argmax_f32.restype = ctypes.c_int
    for symbol in _SILU_SYMBOLS.values():
        fn = getattr(lib, symbol)
        fn.argtypes = ([ctypes.c_void_p, ctypes.c_int64] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_int])
        fn.restype = ctypes.c_int
    for symbol in _ATTENTION_SYMBOLS.values():
        fn = getattr(lib, symbol)
        fn.argtypes = ([ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float, ctypes.c_int64,
                                                                        ctypes.c_int])
        fn.restype = ctypes.c_int
    return lib, ""


def native_gemv(dtype: torch.dtype):
    """The ctypes function of the native GEMV for ``dtype``, or None where it cannot run."""
    return _native(_GEMV_SYMBOLS, dtype)


def _native(symbols: dict, dtype: torch.dtype):
    if dtype not in symbols or not REQUIRED_FLAGS[dtype] <= _cpu_flags():
        return None
    lib = _library()[0]
    return None if lib is None else getattr(lib, symbols[dtype])


def native_amx_gemm(dtype: torch.dtype):
    """The ctypes function of the AMX small-batch GEMM (bf16 only), or None where it cannot
    run: no AMX, or the kernel refused this process the tile state."""
    if dtype != torch.bfloat16 or not REQUIRED_FLAGS[dtype] <= _cpu_flags():
        return None
    lib = _library()[0]
    return lib.inferpath_amx_gemm_bf16 if lib is not None and lib.amx_ready else None


def native_paged_attention(dtype: torch.dtype):
    """The ctypes function of the native paged decode attention for ``dtype``, or None."""
    return _native(_ATTENTION_SYMBOLS, dtype)


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


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` for (rows, vocab) float32 CPU logits, natively where the
    kernel runs (the same indices: first maximum, first NaN), else PyTorch's."""
    fn = _native(_ARGMAX_SYMBOLS, logits.dtype)
    if fn is None or logits.dim() != 2 or logits.device.type != "cpu" or not logits.is_contiguous():
        return logits.argmax(dim=-1)
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    if fn(logits.data_ptr(), out.data_ptr(), logits.shape[0], logits.shape[1], torch.get_num_threads()) != 0:
        return logits.argmax(dim=-1)
    return out


def native_rope(dtype: torch.dtype):
    """The ctypes function of the native RoPE for ``dtype``, or None."""
    return _native(_ROPE_SYMBOLS, dtype)


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


def native_silu_mul(dtype: torch.dtype):
    """The ctypes function of the native SwiGLU gate for ``dtype``, or None."""
    return _native(_SILU_SYMBOLS, dtype)


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


def native_rms_norm(dtype: torch.dtype):
    """The ctypes function of the native RMSNorm for ``dtype``, or None where it cannot run."""
    return _native(_NORM_SYMBOLS, dtype)


def run_rms_norm(fn, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Call a ``native_rms_norm`` function: x (m, n) contiguous, weight (n,), one dtype."""
    out = torch.empty_like(x)
    if fn(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps,
          torch.get_num_threads()) != 0:
        raise RuntimeError(f"rms_norm rejected shape x={tuple(x.shape)}")
    return out


def gemv_available(dtype: torch.dtype) -> bool:
    """Whether the native kernel for ``dtype`` runs on this machine."""
    return native_gemv(dtype) is not None


def run_gemv(fn, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Call a ``native_gemv`` or ``native_amx_gemm`` function without re-checking: x (m, k)
    contiguous, weight (n, k) contiguous, bias (n,) contiguous or None, one dtype."""
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype)
    status = fn(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
                out.data_ptr(), x.shape[0], weight.shape[0], x.shape[1], torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"gemv rejected shapes x={tuple(x.shape)} weight={tuple(weight.shape)}")
    return out


def linear_kernels(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """(gemv, amx) native functions for an ``nn.Linear``'s weight and bias, each None where
    it cannot serve them (dtype, device, layout; AMX needs in_features % 32 == 0)."""
    dtype = weight.dtype
    fits = all(t is None or (t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous())
               for t in (weight, bias))
    if not fits:
        return None, None
    amx = native_amx_gemm(dtype) if weight.shape[1] % 32 == 0 else None
    return native_gemv(dtype), amx


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kernels: tuple):
    """x @ weight.T + bias through the kernel that serves x's row count best (AMX for bf16
    from 2 to AMX_MAX_ROWS rows, else the GEMV up to GEMV_MAX_ROWS), else ``F.linear``.
    Engine A/B on SmolLM2 bf16, step ms GEMV-or-oneDNN vs AMX: batch 1 30.5 vs 31.4,
    batch 4 35.4 vs 31.0, batch 32 59.2 vs 42.5."""
    gemv_fn, amx_fn = kernels
    rows = x.shape[0]
    if x.dtype == weight.dtype and x.dim() == 2:
        if amx_fn is not None and AMX_MIN_ROWS <= rows <= AMX_MAX_ROWS:
            return run_gemv(amx_fn, x.contiguous(), weight, bias)
        if gemv_fn is not None and rows <= GEMV_MAX_ROWS[x.dtype]:
            return run_gemv(gemv_fn, x.contiguous(), weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


def kernel_status() -> str:
    """One line per dtype: whether the native kernels run here, and why not when not."""
    lib, reason = _library()
    lines = []
    for dtype in _GEMV_SYMBOLS:
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


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias with the native kernel: x (m, k), m <= KERNEL_ROWS -> (m, n).

    Falls back to ``F.linear`` when the kernel is unavailable or the inputs do not fit it
    (dtype, device, layout, rows), so it is always correct to call.
    """
    dtype = x.dtype
    fn = native_gemv(dtype)
    if (fn is None or x.dim() != 2 or x.shape[0] > KERNEL_ROWS or x.device.type != "cpu"
            or weight.dtype != dtype or not weight.is_contiguous()
            or (bias is not None and (bias.dtype != dtype or not bias.is_contiguous()))):
        return torch.nn.functional.linear(x, weight, bias)
    return run_gemv(fn, x.contiguous(), weight, bias)
