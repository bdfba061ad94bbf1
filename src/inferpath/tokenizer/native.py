"""The C merge loop for short words (csrc/bpe_merge.c), built with gcc on first use.

``BytePairEncoder`` hands every word missed by its cache in one call per text: the words'
UTF-8 bytes back to back, their offsets, and gets the ids back the same way. The C code is
the same loop as ``BytePairEncoder._merge_ids`` (the Python spec it is tested against); any
machine without a C compiler, or with ``INFERPATH_TOKENIZER_NATIVE=0``, uses the Python
loop, which gives the same ids.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("csrc") / "bpe_merge.c"
CFLAGS = ["-O2", "-shared", "-fPIC"]
MAX_WORD = 256  # csrc MAX_WORD

_lock = threading.Lock()
_library: list = []  # [CDLL or None], decided once


def _load() -> ctypes.CDLL | None:
    if _library:
        return _library[0]
    with _lock:
        if not _library:
            try:
                _library.append(_build())
            except (OSError, subprocess.SubprocessError):
                _library.append(None)
    return _library[0]


def _build() -> ctypes.CDLL | None:
    if os.environ.get("INFERPATH_TOKENIZER_NATIVE", "1") == "0":
        return None
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        return None
    from inferpath.models import cache_dir

    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(CFLAGS).encode() + compiler.encode()).hexdigest()[:16]
    target = Path(cache_dir()) / "tokenizer" / f"bpe_merge_{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            subprocess.run([compiler, *CFLAGS, str(SOURCE), "-o", str(built)], check=True,
                           capture_output=True, timeout=120)
            os.replace(built, target)
    lib = ctypes.CDLL(str(target))
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.inferpath_bpe_merge_words.argtypes = [p, p, i, p, p, p, i, p, p, i]
    lib.inferpath_bpe_build_table.argtypes = [p, p, i, p, p, i]
    return lib


class NativeMerger:
    """The merge table in C's layout and the call that merges many short words at once."""

    def __init__(self, id_table: np.ndarray, byte_ids: list[int | None]) -> None:
        """``id_table``: (2, num_pairs) int64 keys and values (BytePairEncoder.build_id_table)."""
        lib = _load()
        if lib is None:
            raise OSError("the native BPE merge is unavailable")
        self._fn = lib.inferpath_bpe_merge_words
        num_pairs = id_table.shape[1]
        size = 1 << max(4, (2 * num_pairs).bit_length())  # at most half full
        self._keys = np.zeros(size, dtype=np.uint64)
        self._values = np.zeros(size, dtype=np.uint64)
        self._mask = size - 1
        pair_keys = np.ascontiguousarray(id_table[0], dtype=np.uint64)
        pair_values = np.ascontiguousarray(id_table[1], dtype=np.uint64)
        lib.inferpath_bpe_build_table(pair_keys.ctypes.data, pair_values.ctypes.data, num_pairs,
                                      self._keys.ctypes.data, self._values.ctypes.data, self._mask)
        self._byte_ids = np.array([-1 if b is None else b for b in byte_ids], dtype=np.int32)

    def merge_words(self, words: list[bytes]) -> list[list[int]] | None:
        """The ids of each word (each <= MAX_WORD bytes), or None if a byte has no id."""
        data = b"".join(words)
        starts = np.zeros(len(words) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, words), dtype=np.int64, count=len(words)), out=starts[1:])
        out = np.empty(max(len(data), 1), dtype=np.int32)
        out_starts = np.empty(len(words) + 1, dtype=np.int64)
        status = self._fn(self._keys.ctypes.data, self._values.ctypes.data, self._mask,
                          self._byte_ids.ctypes.data, data, starts.ctypes.data, len(words),
                          out.ctypes.data, out_starts.ctypes.data, MAX_WORD)
        if status != 0:
            return None
        ids, bounds = out.tolist(), out_starts.tolist()
        return [ids[a:b] for a, b in zip(bounds, bounds[1:])]
