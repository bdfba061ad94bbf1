"""Quantized weights repacked once at load into groups of eight output rows (csrc/quant/r8.h).

A ``RepackedTensor`` holds a Q4_K, Q5_K or Q6_K matrix's values, scales and float16 d / dmin in
the interleaved layout r8.c's kernel reads: one 32-byte load holds four values of each of
eight rows, so one broadcast of x and one vpdpbusd serve eight output rows and a row's
result needs no horizontal reduction. Q4_K takes 1184 bytes per group and super-block
against the file's 8 x 144 (+2.8%); Q5_K 1440 against 8 x 176 (+2.3%: Q4_K's and the fifth
bits); Q6_K 1696 against 8 x 210 (+1%: 32-byte aligned loads).
Q8_0, Q5_0 and Q4_1 (r8_legacy.c) take a group's 32-value block in the file's bytes exactly
(272 = 8 x 34, 176 = 8 x 22, 160 = 8 x 20): the eight float16 d (and Q4_1's eight m), then
the values four bytes a row.

Which tensors are repacked is the weight plan's (``WeightPlan.repacked``: the allow-list
``REPACK_FORMATS`` at the levels ``REPACK_LEVELS``, where the kernel is SIMD: by default
at ``REPACK_DEFAULT_LEVELS``, else with ``INFERPATH_REPACK=1``); a matrix
whose rows are not a multiple of 8, or that an embedding shares (a tied LM head), stays
as laid out. The repacked copy replaces the mapped one: the file's pages under it are
dropped from this process (``madvise(MADV_DONTNEED)``; a file mapping's pages are read
again from the file if anything touches them), so resident memory stays about the file's
(the 0.5B file with all four formats repacked: 502 MB against 498 as laid out, decode's
peak RSS less the baseline). The copy stays in 4 KiB pages: MADV_HUGEPAGE on its whole
2 MiB pages (the 151,936-row head's among them) measured no faster, decode or prefill
(benchmarks/results/q8repack_ab_05b_2t_avx512.json).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass
from functools import cache

import torch
from gguf import GGMLQuantizationType

from inferpath.kernels import build

Q = GGMLQuantizationType
R8_BASE = 1000  # csrc/quant/blocks.h: a repacked format's kernel id is R8_BASE + its GGUF type
R8_ROWS = 8
REPACK_FORMATS = ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q5_0", "Q4_1")  # the allow-list: formats r8.c / r8_legacy.c have a kernel for
REPACK_LEVELS = ("avx2", "avxvnni", "avx512")  # levels whose r8 kernel is SIMD (generic runs the C spec)
# Levels that repack without INFERPATH_REPACK=1: where prefill is at least as fast as the
# file's layout and decode at one thread, batched decode and verification faster. 512-token
# prefill, AMD EPYC Zen 4 (benchmarks/repack_ab.py, medians of 4 alternating rounds,
# repack_ab_prefill_avx512_1204b.json): avx512 1.5B 1.04x at 2 threads, 1.05x at 1; 0.5B
# 0.98x / 1.18x (avx2: 1.71x, 0.5B 1.13-1.30x). Decode (repack_ab_decode_avx512_1204b.json):
# 1 thread 1.37x (1.5B) and 1.43x (0.5B), 2 threads even on the 1.5B file (the bandwidth);
# batch 8 5.3x its batch 1 against 1.9x. (Before r8_pair.c prefetched its streams the
# 1.5B file's 2-thread prefill had measured 0.84-0.94x here: opt-in then.) Not measured on
# an AMX machine: the AMX-INT8 engine packs the repacked groups' panels like the file's.
REPACK_DEFAULT_LEVELS = ("avx2", "avxvnni", "avx512")
ROW_BYTES = {Q.Q4_K: 1184 // R8_ROWS, Q.Q5_K: 1440 // R8_ROWS, Q.Q6_K: 1696 // R8_ROWS,  # per super-block, a group's / 8
             Q.Q8_0: 272 // R8_ROWS, Q.Q5_0: 176 // R8_ROWS, Q.Q4_1: 160 // R8_ROWS}  # per 32-value block
BLOCK_VALUES = {Q.Q4_K: 256, Q.Q5_K: 256, Q.Q6_K: 256, Q.Q8_0: 32, Q.Q5_0: 32, Q.Q4_1: 32}  # the values ROW_BYTES covers
LEGACY = (Q.Q8_0, Q.Q5_0, Q.Q4_1)  # repacked by r8_legacy.c (the others by r8.c)


@dataclass(frozen=True)
class RepackedTensor:
    """A (rows, cols) quantized matrix in r8.h's layout.

    Invariant: ``data`` is (rows, row_bytes) uint8, contiguous, rows % 8 == 0, row_bytes =
    cols / BLOCK_VALUES[qtype] * ROW_BYTES[qtype]; its rows 8G..8G+7 together hold group G (a row slice at
    multiples of 8 is a slice of groups, ops.dequantized_linear's tiles); ``qtype`` is the
    file's GGUF format."""

    data: torch.Tensor
    qtype: GGMLQuantizationType
    shape: tuple[int, int]

    @property
    def kernel_type(self) -> int:
        return R8_BASE + int(self.qtype)

    @property
    def type_name(self) -> str:
        return self.qtype.name  # the format (a WeightPlan's ``runs``); ``repacked`` tells the layout

    repacked = True

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def dequantize(self) -> torch.Tensor:
        """The float32 values (rows, cols): the file's blocks' values to the bit."""
        from inferpath.kernels import ops

        fn = build.native_quant_dequantize()
        if fn is None:
            raise RuntimeError(f"a repacked {self.qtype.name} tensor needs the native kernels: {build.kernel_status()}")
        return ops.run_dequantize(fn, self.data, self.kernel_type, self.shape[1])


def kernel_type(weight) -> int:
    """The format id the C kernels take for a QuantizedTensor or RepackedTensor."""
    return weight.kernel_type if isinstance(weight, RepackedTensor) else int(weight.qtype)


def repackable(weight) -> bool:
    """Whether r8.c or r8_legacy.c takes this QuantizedTensor (format, whole groups of eight rows)."""
    rows, cols = weight.shape
    return weight.qtype in ROW_BYTES and rows % R8_ROWS == 0 and cols % BLOCK_VALUES[weight.qtype] == 0


def repack(weight, drop_source: bool = True) -> RepackedTensor:
    """``weight`` (a QuantizedTensor that is ``repackable``) repacked; with ``drop_source``
    the mapped file pages wholly inside its bytes are dropped from this process.

    Raises ValueError for a weight r8.c does not take, RuntimeError without the kernels."""
    if not repackable(weight):
        raise ValueError(f"{weight.qtype.name} {tuple(weight.shape)} cannot be repacked by 8 rows: "
                         f"needs {' or '.join(REPACK_FORMATS)}, rows a multiple of 8, whole blocks of columns")
    fn = build.native_quant_repack_legacy() if weight.qtype in LEGACY else build.native_quant_repack()
    if fn is None:
        raise RuntimeError(f"repacking needs the native kernels: {build.kernel_status()}")
    rows, cols = weight.shape
    src = weight.data.contiguous()
    out = torch.empty((rows, cols // BLOCK_VALUES[weight.qtype] * ROW_BYTES[weight.qtype]), dtype=torch.uint8)
    if fn(int(weight.qtype), src.data_ptr(), src.shape[1], rows, cols, out.data_ptr(), torch.get_num_threads()) != 0:
        raise RuntimeError(f"repack rejected {weight.qtype.name} {tuple(weight.shape)}")
    if drop_source:
        drop_file_pages(src.data_ptr(), src.numel())
    return RepackedTensor(out, weight.qtype, (rows, cols))


MADV_DONTNEED = 4


@cache
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes, libc.madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return libc


def _file_mapping(address: int, length: int) -> bool:
    """Whether [address, address + length) lies in one mapping of a file (/proc/self/maps):
    only there is dropping pages safe (an anonymous page dropped would read back as zeros)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                lo, hi = (int(v, 16) for v in fields[0].split("-"))
                if lo <= address and address + length <= hi:
                    return len(fields) >= 6 and fields[5].startswith("/") and fields[4] != "0"
    except OSError:
        pass
    return False


def drop_file_pages(address: int, length: int) -> int:
    """Drop this process's pages of a file mapping wholly inside [address, address +
    length) (madvise MADV_DONTNEED): the bytes dropped, 0 where it is not a file mapping."""
    page = mmap.PAGESIZE
    lo, hi = -(-address // page) * page, (address + length) // page * page
    if hi <= lo or os.name != "posix" or not _file_mapping(address, length):
        return 0
    return hi - lo if _libc().madvise(lo, hi - lo, MADV_DONTNEED) == 0 else 0
