"""The merge table over ids of a tiktoken rank file, derived once and cached on disk.

A tiktoken file lists tokens and ranks only: the rank of an adjacent pair is the rank of
its concatenation, when that is a token. The same rule as an id table
(``BytePairEncoder.build_id_table``'s layout: key ``left_id * ID_SPAN + right_id``, value
``rank << 32 | merged_id``) holds one entry for every split of every token into two tokens,
so the native merge loop and the id path serve tiktoken files too: each pair the string
path would rank by its concatenation is in the table with that rank (a token's id is its
rank), and no other pair is.

Deriving it visits every split of 128,000 tokens (~1 s in Python); the table is stored
under ``$INFERPATH_CACHE/tokenizer-tables`` keyed by the digest of the file's bytes and of
this code, and read back (checked) on later loads.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import tempfile
from pathlib import Path

import numpy as np

from inferpath.tokenizer.bpe import ID_SPAN


def derive_id_table(vocab: dict[str, int]) -> np.ndarray | None:
    """(2, num_pairs) int64 over every two-token split of every token; None when an id does
    not fit the key (the string path then serves)."""
    if max(vocab.values(), default=0) >= ID_SPAN:
        return None
    keys: list[int] = []
    values: list[int] = []
    get = vocab.get
    for piece, rank in vocab.items():
        for cut in range(1, len(piece)):
            left_id = get(piece[:cut])
            if left_id is None:
                continue
            right_id = get(piece[cut:])
            if right_id is not None:
                keys.append(left_id * ID_SPAN + right_id)
                values.append(rank << 32 | rank)
    # NOTE: a (left, right) pair concatenates to one string only, so keys are unique
    return np.array([keys, values], dtype=np.int64).reshape(2, len(keys))


def cached_id_table(path: Path, file_bytes: bytes, vocab: dict[str, int]) -> np.ndarray | None:
    """``derive_id_table(vocab)``, read from the cache when this file and this code made it
    before, else derived and stored (best effort: an unwritable cache only costs time)."""
    digest = hashlib.sha256(file_bytes + _code_version()).hexdigest()[:32]
    entry = _cache_dir() / f"tiktoken-{digest}.npy"
    table = _read(entry)
    if table is not None and table.dtype == np.int64 and table.ndim == 2 and table.shape[0] == 2:
        return table
    table = derive_id_table(vocab)
    if table is not None:
        _write(entry, table)
    return table


def _cache_dir() -> Path:
    root = os.environ.get("INFERPATH_CACHE") or "~/.cache/inferpath"
    return Path(root).expanduser() / "tokenizer-tables"


@functools.cache
def _code_version() -> bytes:
    return hashlib.sha256(Path(__file__).read_bytes()).digest()


def _read(entry: Path) -> np.ndarray | None:
    """The stored array if its checksum (the first 32 bytes) matches, else None."""
    try:
        content = entry.read_bytes()
    except OSError:
        return None
    checksum, payload = content[:32], content[32:]
    if hashlib.sha256(payload).digest() != checksum:
        return None
    try:
        return np.load(io.BytesIO(payload), allow_pickle=False)
    except ValueError:
        return None


def _write(entry: Path, table: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, table, allow_pickle=False)
    payload = buffer.getvalue()
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=entry.parent, suffix=".tmp", delete=False) as tmp:
            tmp.write(hashlib.sha256(payload).digest() + payload)
        os.replace(tmp.name, entry)  # atomic: a reader sees the whole entry or none
    except OSError:
        return
