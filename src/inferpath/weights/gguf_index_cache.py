"""The on-disk cache of GGUF indexes: a file's header is walked once, not once per process.

One entry per GGUF file (by real path) under ``$INFERPATH_CACHE/gguf-index`` (default
``~/.cache/inferpath/gguf-index``): a JSON file holding the ``GGUFIndex`` (gguf_index.py)
the checked walk produced, preceded by the SHA-256 of that JSON.

Trust: an entry is a hint, never an answer. It is used only if its digest matches its
bytes (a torn or corrupted write is ignored), it was written by the same code
(``entry_format``: a digest of the sources that make and check an index, and of gguf's
constants), it names the same real path and file size, and then ``read_gguf_index`` compares the
file's header bytes with the digest the entry recorded. Any failure to read or write the
cache only costs the walk. Files whose header is smaller than ``MIN_HEADER_BYTES`` (the
walk takes under ~2 ms) are not cached; at most ``MAX_ENTRIES`` entries are kept.

Readers may store arrays they derive from a file's metadata beside its entry
(``read_array`` / ``write_array``: the tokenizer's merge table over ids), keyed by the
header's digest and a name that carries the deriving code's version, checked by their own
SHA-256. NOTE: the cache directory is trusted as the model directory is: an entry forged
with matching digests would be believed.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from inferpath.weights.gguf_index import GGUFIndex

MIN_HEADER_BYTES = 64 * 1024
MAX_ENTRIES = 32


def index_cache_dir() -> Path:
    """``$INFERPATH_CACHE/gguf-index`` or ``~/.cache/inferpath/gguf-index``."""
    return Path(os.environ.get("INFERPATH_CACHE") or "~/.cache/inferpath").expanduser() / "gguf-index"


@functools.cache
def entry_format() -> str:
    """Changes whenever the code that makes or checks an index does, or gguf's constants."""
    import gguf.constants

    from inferpath.weights import gguf_check, gguf_index

    digest = hashlib.sha256()
    for module in (gguf_check, gguf_index, gguf.constants):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:32]


def entry_path(real_path: str) -> Path:
    return index_cache_dir() / f"{hashlib.sha256(real_path.encode()).hexdigest()[:32]}.json"


def read(real_path: str, file_size: int) -> GGUFIndex | None:
    """The cached index of the file at ``real_path`` if an intact entry of this code's
    format and this size exists, else None (the caller still compares the header bytes)."""
    try:
        raw = entry_path(real_path).read_bytes()
        digest, _, payload = raw.partition(b"\n")
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            return None
        entry = json.loads(payload)
        if entry["format"] != entry_format() or entry["path"] != real_path:
            return None
        index = GGUFIndex.from_json(Path(real_path), entry["index"])
    except Exception:  # noqa: BLE001  a cache entry is a hint: anything wrong with it is a miss
        return None
    return index if index.file_size == file_size else None


def write(real_path: str, index: GGUFIndex) -> None:
    """Store ``index`` (best effort: a read-only or full disk only costs the next walk)."""
    if index.header_bytes < MIN_HEADER_BYTES:
        return
    payload = json.dumps({"format": entry_format(), "path": real_path, "index": index.to_json()},
                         ensure_ascii=False).encode("utf-8")
    _write_atomically(entry_path(real_path), hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


def read_array(index: GGUFIndex, name: str) -> np.ndarray | None:
    """An array a reader derived from ``index``'s file and stored under ``name`` (which
    must name the deriving code's version), if intact; else None. Keyed by the header's
    digest: any file whose header is byte for byte the same shares it."""
    try:
        raw = _array_path(index, name).read_bytes()
        digest, payload = raw[:32], raw[32:]
        if hashlib.sha256(payload).digest() != digest:
            return None
        return np.load(io.BytesIO(payload), allow_pickle=False)
    except Exception:  # noqa: BLE001  a hint, as index entries are
        return None


def write_array(index: GGUFIndex, name: str, array: np.ndarray) -> None:
    """Store ``array`` for ``read_array`` (best effort; files too small to cache skipped)."""
    if index.header_bytes < MIN_HEADER_BYTES:
        return
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    payload = buffer.getvalue()
    _write_atomically(_array_path(index, name), hashlib.sha256(payload).digest() + payload)


def _array_path(index: GGUFIndex, name: str) -> Path:
    return index_cache_dir() / f"{index.header_sha256[:32]}-{name}.npy"


def _write_atomically(target: Path, content: bytes) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".tmp", delete=False) as tmp:
            try:
                tmp.write(content)
            except OSError:
                os.unlink(tmp.name)
                raise
        os.replace(tmp.name, target)  # atomic: readers see the old entry or the new one
        _prune(target.parent)
    except OSError:
        return


def _prune(directory: Path) -> None:
    for pattern in ("*.json", "*.npy"):
        entries = sorted(directory.glob(pattern), key=lambda p: p.stat().st_mtime_ns)
        for stale in entries[:-MAX_ENTRIES]:
            stale.unlink(missing_ok=True)
