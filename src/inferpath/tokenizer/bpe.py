"""Byte-level BPE: the merge loop for one pre-token, with a cache in front of it.

Byte-level means the alphabet is the 256 byte values, each written as one printable
character (GPT-2's table: ``" "`` becomes ``"Ġ"``, ``"\\n"`` becomes ``"Ċ"``). Vocabulary
entries and merges are strings over that alphabet, so a pre-token is first turned into its
UTF-8 bytes, each byte into its character, and then merged.

Merging follows the Hugging Face / tiktoken rule: repeatedly merge the adjacent pair with
the lowest rank, leftmost first, until no adjacent pair has a rank. The rank of a pair is
its index in the merge list, or (for tiktoken rank files, ``merge_ranks=None``) the rank of
the concatenated token. Both are done with a heap over a linked list, so a long piece (a
run of 10,000 spaces) costs O(n log n), not O(n^2).
"""

from __future__ import annotations

import heapq
from itertools import chain


def _bytes_to_unicode() -> list[str]:
    """GPT-2's table: byte value -> one printable character (printable bytes map to themselves)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    next_free = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + next_free)
            next_free += 1
    return [table[b] for b in range(256)]


BYTE_TO_CHAR: list[str] = _bytes_to_unicode()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate table: a latin-1 decoded byte string -> its byte-level characters
_LATIN1_TO_BYTE_CHARS = {b: BYTE_TO_CHAR[b] for b in range(256)}


def bytes_to_piece(data: bytes) -> str:
    """Raw bytes -> the byte-level string a vocabulary stores."""
    return data.decode("latin-1").translate(_LATIN1_TO_BYTE_CHARS)


def piece_to_bytes(piece: str) -> bytes:
    """Byte-level vocabulary string -> raw bytes. Characters outside the table keep their
    UTF-8 form (vocabularies sometimes hold such entries; they are never produced by BPE)."""
    out = bytearray()
    for char in piece:
        byte = CHAR_TO_BYTE.get(char)
        if byte is None:
            out += char.encode("utf-8")
        else:
            out.append(byte)
    return bytes(out)


class BytePairEncoder:
    """Encodes pre-tokens (text) to ids with one vocabulary and one merge table.

    Invariants: every result is cached per pre-token string (bounded by ``max_cache_size``,
    cleared when full); results never depend on the cache. ``vocab`` maps byte-level strings to
    ids; a byte with no entry is dropped (so only a vocabulary holding all 256 bytes can
    encode every string losslessly).
    """

    def __init__(
        self,
        vocab: dict[str, int],
        merge_ranks: dict[tuple[str, str], int] | None,
        ignore_merges: bool = False,
        max_cache_size: int = 200_000,
    ):
        self.vocab = vocab
        self.merge_ranks = merge_ranks
        self.ignore_merges = ignore_merges
        self.max_cache_size = max_cache_size
        self.cache: dict[str, list[int]] = {}

    def encode_pieces(self, pieces: list[str]) -> list[int]:
        """The ids of consecutive pre-tokens. The hot path: one cache lookup per piece, done by
        ``map`` in C; only misses run BPE."""
        get = self.cache.get
        piece_ids = list(map(get, pieces))
        if None in piece_ids:
            for i, ids in enumerate(piece_ids):
                if ids is None:
                    piece_ids[i] = get(pieces[i]) or self.encode_piece(pieces[i])
        return list(chain.from_iterable(piece_ids))

    def encode_piece(self, piece: str) -> list[int]:
        """The ids of one pre-token (cached)."""
        vocab = self.vocab
        # NOTE: a byte missing from the vocabulary (SmolLM2 has no 0xF5..0xFF) is dropped, as
        # Hugging Face tokenizers (no unk token) and llama.cpp drop it.
        piece_ids = [
            vocab[s]
            for s in self.merge(bytes_to_piece(piece.encode("utf-8")))
            if s in vocab
        ]
        if len(self.cache) >= self.max_cache_size:
            self.cache.clear()
        self.cache[piece] = piece_ids
        return piece_ids

    def merge(self, word: str) -> list[str]:
        """Apply merges to a byte-level string; returns the final symbols."""
        if len(word) <= 1 or (self.ignore_merges and word in self.vocab):
            return [word] if word else []
        symbols: list[str | None] = list(
            word
        )  # None marks a symbol merged into its left neighbour
        num_symbols = len(symbols)
        next_index = list(range(1, num_symbols + 1))  # num_symbols = end of list
        prev_index = list(range(-1, num_symbols - 1))
        heap: list[tuple[int, int, str, str]] = []
        for i in range(num_symbols - 1):
            rank = self._rank(symbols[i], symbols[i + 1])
            if rank is not None:
                heap.append((rank, i, symbols[i], symbols[i + 1]))
        heapq.heapify(heap)
        while heap:
            rank, i, left, right = heapq.heappop(heap)
            j = next_index[i] if symbols[i] is not None else num_symbols
            # NOTE: stale entries (a side was merged away since the push) are skipped here
            if symbols[i] != left or j >= num_symbols or symbols[j] != right:
                continue
            merged = left + right
            symbols[i] = merged
            symbols[j] = None
            next_index[i] = next_index[j]
            if next_index[i] < num_symbols:
                prev_index[next_index[i]] = i
                after = symbols[next_index[i]]
                new_rank = self._rank(merged, after)
                if new_rank is not None:
                    heapq.heappush(heap, (new_rank, i, merged, after))
            if prev_index[i] >= 0:
                before = symbols[prev_index[i]]
                new_rank = self._rank(before, merged)
                if new_rank is not None:
                    heapq.heappush(heap, (new_rank, prev_index[i], before, merged))
        return [s for s in symbols if s is not None]

    def _rank(self, left: str, right: str) -> int | None:
        if self.merge_ranks is None:
            return self.vocab.get(left + right)  # tiktoken: rank of the merged token
        return self.merge_ranks.get((left, right))
