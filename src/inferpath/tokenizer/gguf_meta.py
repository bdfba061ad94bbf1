"""Read the key/value metadata of a GGUF file (not its tensors).

Why not ``gguf.GGUFReader``: it builds a numpy view for every element of every array, which
for a 150,000-token vocabulary takes tens of seconds. The tokenizer needs only the metadata,
which is a flat list of typed values at the start of the file; this reads it in one pass.

Layout (little-endian): ``b"GGUF"``, version u32 (2 or 3), tensor count u64, key/value count
u64, then per key: string key, u32 value type, value. A string is a u64 length plus UTF-8
bytes; an array is a u32 element type, a u64 count and the elements.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

from inferpath.errors import ModelFileError

# value type -> (struct format, size) for fixed-size scalars
_SCALARS = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, buffer, path: Path):
        self.buffer = buffer
        self.offset = 0
        self.path = path

    def unpack(self, fmt: str, size: int):
        if self.offset + size > len(self.buffer):
            raise ModelFileError(
                f"GGUF file {self.path} is truncated at byte {self.offset} (metadata incomplete)"
            )
        (value,) = struct.unpack_from(fmt, self.buffer, self.offset)
        self.offset += size
        return value

    def string(self) -> str:
        length = self.unpack("<Q", 8)
        end = self.offset + length
        if end > len(self.buffer):
            raise ModelFileError(
                f"GGUF file {self.path}: a string of {length} bytes runs past the end of the file"
            )
        text = bytes(self.buffer[self.offset : end]).decode("utf-8", errors="replace")
        self.offset = end
        return text

    def value(self, value_type: int) -> Any:
        if value_type in _SCALARS:
            return self.unpack(*_SCALARS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type = self.unpack("<I", 4)
            count = self.unpack("<Q", 8)
            if item_type == _STRING:
                return [self.string() for _ in range(count)]
            if item_type in _SCALARS:
                fmt, size = _SCALARS[item_type]
                end = self.offset + size * count
                if end > len(self.buffer):
                    raise ModelFileError(
                        f"GGUF file {self.path}: an array of {count} values runs past the end"
                    )
                values = list(
                    struct.unpack_from(f"<{count}{fmt[1]}", self.buffer, self.offset)
                )
                self.offset = end
                return values
            return [self.value(item_type) for _ in range(count)]
        raise ModelFileError(
            f"GGUF file {self.path}: unknown value type {value_type} at byte {self.offset}"
        )


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """All metadata key/values of a GGUF file, as Python values (arrays as lists)."""
    path = Path(path)
    with open(path, "rb") as file:
        if file.read(4) != b"GGUF":
            raise ModelFileError(
                f"{path} is not a GGUF file (the first 4 bytes are not b'GGUF')"
            )
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            cursor = _Cursor(memoryview(buffer), path)
            try:
                cursor.offset = 4
                version = cursor.unpack("<I", 4)
                if version not in (2, 3):
                    raise ModelFileError(
                        f"GGUF file {path} has version {version}; supported: 2, 3"
                    )
                cursor.unpack("<Q", 8)  # tensor count
                num_kv = cursor.unpack("<Q", 8)
                metadata = {}
                for _ in range(num_kv):
                    key = cursor.string()
                    metadata[key] = cursor.value(cursor.unpack("<I", 4))
                return metadata
            finally:
                cursor.buffer.release()
