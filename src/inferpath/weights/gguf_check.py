"""Read a GGUF file's header, metadata and tensor table, checking them before anything trusts them.

``gguf.GGUFReader`` believes the counts a file states: a ``tensor_count`` or an array
length of 2^40 makes it loop or allocate for minutes, nested arrays recurse without
bound, and a ``head_count`` of 0 reaches a division; it also builds a numpy view per
vocabulary string (~0.5 s for 49k tokens). ``check_gguf(path)`` walks the bytes once, with
every count checked against the bytes left in the file before it is used, and returns the
file's ``GGUFIndex`` (metadata values, tensor table; gguf_index.py) or raises
``WeightsError`` (a ``ModelFileError``) naming the file, the field, the value and what is
allowed. It costs one pass over the metadata (~0.05 s for a 49k-token vocabulary) and
reads no tensor data; types and block sizes are the ``gguf`` package's constants.

Layout (little-endian, GGUF v2/v3): magic "GGUF", u32 version, u64 tensor_count,
u64 kv_count; kv_count × (string key, u32 type, value); tensor_count × (string name,
u32 n_dims, n_dims × u64 dim, u32 ggml type, u64 offset); padding to ``general.alignment``
(default 32); tensor data. A string is a u64 length and that many UTF-8 bytes; an array
is a u32 item type, a u64 count and the items.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from pathlib import Path
from typing import Any

from inferpath.weights.errors import WeightsError
from inferpath.weights.gguf_index import GGUFIndex, TensorInfo, header_digest

SUPPORTED_VERSIONS = (2, 3)
#: Arrays of arrays are allowed this deep (llama.cpp writes none; the format allows them).
MAX_ARRAY_DEPTH = 2
#: ggml tensors have at most 4 dimensions.
MAX_TENSOR_DIMS = 4
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
# the smallest a value of each type can be, in bytes (to bound counts by the bytes left)
_MIN_SIZE = {**{t: struct.calcsize(f) for t, f in _SCALARS.items()}, _STRING: 8, _ARRAY: 12}
#: The largest a size in the metadata may be (the longest real context is ~10M tokens);
#: sizes size tables (RoPE, layers) before any tensor is read.
MAX_MODEL_SIZE = 2**24
#: The most layers a model may have (the deepest real ones have ~200).
MAX_LAYERS = 2**16
# metadata that must be a positive integer when present (a zero divides, later)
_POSITIVE_KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length",
                  "attention.head_count", "attention.head_count_kv", "attention.key_length",
                  "attention.value_length", "vocab_size", "expert_count", "expert_used_count",
                  "rope.dimension_count")


class _Cursor:
    """Reads little-endian values from ``data`` and names the field being read on failure."""

    def __init__(self, data: Any, path: Path):
        self.data = data
        self.path = path
        self.offset = 0
        self.field = "header"

    def fail(self, what: str) -> WeightsError:
        return WeightsError(f"{self.path}: GGUF {self.field} (at byte {self.offset}): {what}")

    @property
    def num_left(self) -> int:
        return len(self.data) - self.offset

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if size > self.num_left:
            raise self.fail(f"needs {size} bytes but the file ends after {self.num_left}: "
                            "it is truncated")
        (value,) = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += size
        return value

    def count(self, what: str, min_item_size: int) -> int:
        """A u64 count of items of at least ``min_item_size`` bytes that must fit in the file."""
        n = self.unpack("<Q")
        if n * max(min_item_size, 1) > self.num_left:
            raise self.fail(f"{what} is {n}, but {self.num_left} bytes are left in the file "
                            f"and each takes at least {min_item_size}: allowed is at most "
                            f"{self.num_left // max(min_item_size, 1)}")
        return n

    def string(self) -> str:
        n = self.count("the string length", 1)
        raw = bytes(self.data[self.offset:self.offset + n])  # no view of the map outlives it
        self.offset += n
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"a string is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None

    def strings(self, n: int) -> list[str]:
        """``n`` strings back to back (a vocabulary: the hot loop of the walk)."""
        data, offset, end = self.data, self.offset, len(self.data)
        unpack, out = _U64.unpack_from, []
        try:
            for _ in range(n):
                if end - offset < 8:
                    self.offset = offset
                    raise self.fail(f"string {len(out)} of the array needs 8 bytes for its length "
                                    f"but the file ends after {end - offset}: it is truncated")
                (length,) = unpack(data, offset)
                offset += 8
                if length > end - offset:
                    self.offset = offset
                    raise self.fail(f"string {len(out)} of the array is {length} bytes, but "
                                    f"{end - offset} bytes are left in the file")
                out.append(str(data[offset:offset + length], "utf-8"))
                offset += length
        except UnicodeDecodeError as exc:
            self.offset = offset
            raise self.fail(f"string {len(out)} of the array is not valid UTF-8 ({exc.reason} at "
                            f"byte {exc.start})") from None
        self.offset = offset
        return out

    def value(self, value_type: int, depth: int = 0) -> Any:
        """The value: a scalar, a string, or a list (arrays)."""
        if value_type in _SCALARS:
            return self.unpack(_SCALARS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type != _ARRAY:
            raise self.fail(f"value type {value_type} is not a GGUF type (allowed: 0..12)")
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"arrays are nested more than {MAX_ARRAY_DEPTH} deep")
        item_type = self.unpack("<I")
        if item_type not in _MIN_SIZE:
            raise self.fail(f"array item type {item_type} is not a GGUF type (allowed: 0..12)")
        n = self.count("the array length", _MIN_SIZE[item_type])
        if item_type in _SCALARS:  # n fits: count() checked n * item size against the file
            values = list(struct.unpack_from(f"<{n}{_SCALARS[item_type][1]}", self.data, self.offset))
            self.offset += n * _MIN_SIZE[item_type]
            return values
        if item_type == _STRING:
            return self.strings(n)
        return [self.value(item_type, depth + 1) for _ in range(n)]


def check_gguf(path: str | Path) -> GGUFIndex:
    """The index of ``path`` (metadata values and tensor table), read in one checked walk;
    raise WeightsError unless it is a well-formed GGUF file (see the module doc).
    ``gguf_index.read_gguf_index`` is the cached way in; this one always reads the file."""
    path = Path(path)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            raise WeightsError(f"{path}: the file is empty, not a GGUF file")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            cur = _Cursor(memoryview(data), path)
            try:
                metadata, tensors, data_start = _walk(cur)
                header_sha256 = header_digest(cur.data[:data_start])
            finally:
                cur.data.release()  # before the mmap closes
    _check_model_keys(cur, metadata, len(tensors))
    return GGUFIndex(path=path, file_size=size, header_bytes=data_start, header_sha256=header_sha256,
                     metadata=metadata, tensors=tuple(tensors))


def _walk(cur: _Cursor) -> tuple[dict[str, Any], list[TensorInfo], int]:
    magic = cur.unpack("<4s")
    if magic != b"GGUF":
        raise cur.fail(f"magic is {magic!r}; a GGUF file starts with b'GGUF'")
    cur.field = "version"
    version = cur.unpack("<I")
    if version not in SUPPORTED_VERSIONS:
        raise cur.fail(f"is {version}; supported: {SUPPORTED_VERSIONS}")
    cur.field = "tensor_count"
    tensor_count = cur.unpack("<Q")
    cur.field = "kv_count"
    kv_count = cur.unpack("<Q")
    # each key/value takes at least 8 + 1 + 4 + 1 bytes, each tensor 8 + 1 + 4 + 4 + 8
    if kv_count * 14 + tensor_count * 25 > cur.num_left:
        cur.field = "tensor_count / kv_count"
        raise cur.fail(f"{tensor_count} tensors and {kv_count} keys cannot fit in the "
                       f"{cur.num_left} bytes left in the file")
    metadata = _check_metadata(cur, kv_count)
    tensors, data_start = _check_tensors(cur, tensor_count, metadata)
    return metadata, tensors, data_start


def _check_metadata(cur: _Cursor, kv_count: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for i in range(kv_count):
        cur.field = f"key {i}"
        key = cur.string()
        if key in metadata:
            raise cur.fail(f"{key!r} appears twice")
        cur.field = f"key {key!r}"
        metadata[key] = cur.value(cur.unpack("<I"))
    return metadata


def _check_tensors(cur: _Cursor, tensor_count: int, metadata: dict[str, Any]) -> tuple[list[TensorInfo], int]:
    """The tensor table, checked (names, shapes, types, data inside the file), and the
    offset where the tensor data starts."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    infos = []
    names = set()
    for i in range(tensor_count):
        cur.field = f"tensor {i}"
        name = cur.string()
        if name in names:
            raise cur.fail(f"tensor name {name!r} appears twice")
        names.add(name)
        cur.field = f"tensor {name!r}"
        n_dims = cur.unpack("<I")
        if not 1 <= n_dims <= MAX_TENSOR_DIMS:
            raise cur.fail(f"has {n_dims} dimensions; allowed: 1..{MAX_TENSOR_DIMS}")
        dims = [cur.unpack("<Q") for _ in range(n_dims)]
        raw_type = cur.unpack("<I")
        try:
            qtype = GGMLQuantizationType(raw_type)
            block_size, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise cur.fail(f"ggml type {raw_type} is unknown") from None
        offset = cur.unpack("<Q")
        num_elements = 1
        for d in dims:
            num_elements *= d
        if num_elements == 0 or dims[0] % block_size:
            raise cur.fail(f"shape {dims} is not allowed: no dimension may be 0, and the first "
                           f"must be a multiple of {block_size} ({qtype.name} blocks)")
        shape = tuple(reversed(dims))  # as PyTorch shows it
        infos.append(TensorInfo(name, qtype, shape, offset, num_elements // block_size * type_size))
    cur.field = "general.alignment"
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"is {alignment!r}; allowed: a power of two")
    data_start = -(-cur.offset // alignment) * alignment
    tensors = []
    for info in infos:  # offsets in the table count from data_start; the index's from 0
        info = dataclasses.replace(info, offset=data_start + info.offset)
        if info.offset + info.nbytes > len(cur.data):
            raise WeightsError(
                f"{cur.path}: tensor {info.name!r} (shape {info.shape}, {info.qtype.name}) needs "
                f"bytes up to offset {info.offset + info.nbytes} but the file has only "
                f"{len(cur.data)} bytes: the file is truncated; download it again")
        tensors.append(info)
    return tensors, min(data_start, len(cur.data))


def _check_model_keys(cur: _Cursor, metadata: dict[str, Any], tensor_count: int) -> None:
    arch = metadata.get("general.architecture")
    if arch is not None and not isinstance(arch, str):
        cur.field = "general.architecture"
        raise cur.fail(f"is {arch!r}; allowed: a string")
    for suffix in _POSITIVE_KEYS:
        key = f"{arch}.{suffix}"
        if key not in metadata or isinstance(metadata[key], list):  # a list: per layer
            continue
        value = metadata[key]
        limit = MAX_MODEL_SIZE
        if suffix == "block_count":  # every layer has tensors (vocab-only files have none)
            limit = min(MAX_LAYERS, tensor_count or MAX_LAYERS)
        elif suffix.startswith("attention.head_count"):
            hidden = metadata.get(f"{arch}.embedding_length")
            if isinstance(hidden, int) and hidden > 0:
                limit = min(limit, hidden)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise WeightsError(f"{cur.path}: GGUF {key} is {value!r}; allowed: an integer "
                               f"in 1..{limit}")
