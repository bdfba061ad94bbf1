"""The index of a GGUF file: its metadata and tensor table, read and checked once per file.

Every reader of a GGUF file starts from a ``GGUFIndex``: weights/gguf.py (the config and
the tensors), tokenizer/load.py (the vocabulary) and explain/ (shapes). It holds the
metadata values (arrays as lists) and, per tensor, its name, ggml type, shape, byte offset
and size; tensor data are views of the memory-mapped file (``map_data``, ``array``),
never copies.

``read_gguf_index(path)`` finds the index, cheapest first:

1. this process's last few indexes (the weights and the tokenizer of one load read one
   file);
2. the on-disk cache (gguf_index_cache.py, under ``$INFERPATH_CACHE/gguf-index``);
3. the checked walk of gguf_check.py (~0.05 s for a 49k-token vocabulary), whose index
   goes to both.

Invariant: an index from 1 or 2 is used only when the file has the same size and its
header bytes (everything before the tensor data: all that the index and gguf_check's
checks are made of, the tensor bounds aside, which the size decides) have the same
SHA-256 as when it was walked. So a rewritten file is walked again whatever its
timestamps say, and every index returned describes a file that passed gguf_check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from inferpath.weights.errors import WeightsError

Q = GGMLQuantizationType
# element types of unquantized tensors: GGUFReader's views of the same bytes
_ITEM_TYPES = {Q.F32: np.float32, Q.F16: np.float16}
_MAX_RECENT = 4


@dataclass(frozen=True)
class TensorInfo:
    """One row of the tensor table: ``shape`` as PyTorch shows it (rows, cols), ``offset``
    of its first byte in the file, ``nbytes`` of its data (whole GGUF blocks)."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def num_elements(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class GGUFIndex:
    """What a GGUF file holds, without its tensor data (see the module docstring).

    ``header_bytes`` is where the tensor data start (the walk read everything before);
    ``header_sha256`` their digest. ``metadata`` must not be mutated: indexes are shared.
    """

    path: Path
    file_size: int
    header_bytes: int
    header_sha256: str
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]

    def field(self, key: str, default: Any = None) -> Any:
        """One metadata value (scalar, string or list), or ``default`` if absent."""
        return self.metadata.get(key, default)

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)

    def map_data(self) -> np.ndarray:
        """The file's bytes, memory-mapped copy-on-write: (file_size,) uint8. Pages are
        shared with the page cache until written; a write (only the loader's, putting Q and
        K rows in Hugging Face order in place) changes this process's copy, never the file.

        NOTE: Linux charges a private writable mapping against the commit limit, and refuses
        one larger than RAM + swap; such a file is mapped read-only (``writeable`` False).
        """
        try:
            data = np.memmap(self.path, dtype=np.uint8, mode="c")
        except OSError:  # ENOMEM: see the note
            data = np.memmap(self.path, dtype=np.uint8, mode="r")
        if len(data) != self.file_size:
            raise WeightsError(f"{self.path}: the file changed while it was being loaded "
                               f"({self.file_size} bytes, now {len(data)}); load it again")
        # NOTE: slices of an np.memmap are memmaps, whose bookkeeping costs; a plain ndarray
        # view maps the same pages (and keeps the mapping alive through its base)
        return data.view(np.ndarray)

    def array(self, data: np.ndarray, info: TensorInfo) -> np.ndarray:
        """The tensor's data in ``data`` (``map_data()``), as GGUFReader shapes it: F32/F16
        as values of ``info.shape``; block formats as bytes (rows, row_bytes)."""
        raw = data[info.offset:info.offset + info.nbytes]
        if info.qtype in _ITEM_TYPES:
            return raw.view(_ITEM_TYPES[info.qtype]).reshape(info.shape)
        block_size, type_size = GGML_QUANT_SIZES[info.qtype]
        return raw.reshape(*info.shape[:-1], info.shape[-1] // block_size * type_size)

    # ------------------------------------------------------------------ JSON (the cache)
    def to_json(self) -> dict[str, Any]:
        return {"file_size": self.file_size, "header_bytes": self.header_bytes,
                "header_sha256": self.header_sha256, "metadata": self.metadata,
                "tensors": [[t.name, int(t.qtype), list(t.shape), t.offset, t.nbytes] for t in self.tensors]}

    @classmethod
    def from_json(cls, path: Path, entry: dict[str, Any]) -> GGUFIndex:
        """The index ``to_json`` wrote; raises (KeyError, TypeError, ValueError) on any entry
        not of that form, or whose tensors do not fit in ``file_size``."""
        size = _int(entry["file_size"])
        tensors = []
        for name, qtype, shape, offset, nbytes in entry["tensors"]:
            info = TensorInfo(str(name), Q(_int(qtype)), tuple(_int(d) for d in shape), _int(offset), _int(nbytes))
            block_size, type_size = GGML_QUANT_SIZES[info.qtype]
            if info.num_elements // block_size * type_size != info.nbytes or info.offset + info.nbytes > size:
                raise ValueError(f"tensor {info.name!r} is inconsistent")
            tensors.append(info)
        metadata = entry["metadata"]
        if not isinstance(metadata, dict) or not isinstance(entry["header_sha256"], str):
            raise TypeError("metadata and header_sha256 must be an object and a string")
        return cls(path, size, _int(entry["header_bytes"]), entry["header_sha256"], metadata, tuple(tensors))


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value


def header_digest(header: Any) -> str:
    """SHA-256 of a file's header bytes (a bytes-like object)."""
    return hashlib.sha256(header).hexdigest()


_recent: OrderedDict[str, GGUFIndex] = OrderedDict()  # real path -> index, most recent last


def read_gguf_index(path: str | Path) -> GGUFIndex:
    """The index of the GGUF file at ``path`` (see the module docstring); raises
    WeightsError, naming the file and what is wrong, for a file that is not well-formed."""
    from inferpath.weights import gguf_check, gguf_index_cache

    path = Path(path)
    real = os.path.realpath(path)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        known = _recent.get(real)
        if known is None or not _describes(known, file.fileno(), size):
            known = gguf_index_cache.read(real, size)
            if known is not None and not _describes(known, file.fileno(), size):
                known = None
    if known is not None:
        _remember(real, known)
        return dataclasses.replace(known, path=path)
    index = gguf_check.check_gguf(path)
    _remember(real, index)
    gguf_index_cache.write(real, index)
    return index


def _describes(index: GGUFIndex, fd: int, size: int) -> bool:
    """Whether ``index`` was walked from the bytes now in the file (see the invariant)."""
    if index.file_size != size or index.header_bytes > size:
        return False
    return header_digest(os.pread(fd, index.header_bytes, 0)) == index.header_sha256


def _remember(real: str, index: GGUFIndex) -> None:
    _recent[real] = index
    _recent.move_to_end(real)
    while len(_recent) > _MAX_RECENT:
        _recent.popitem(last=False)
