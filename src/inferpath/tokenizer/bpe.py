"""Byte-level BPE: the merge loop for one pre-token, with a cache in front of it.

Byte-level means the alphabet is the 256 byte values, each written as one printable
character (GPT-2's table: ``" "`` becomes ``"Ġ"``, ``"\\n"`` becomes ``"Ċ"``). Vocabulary
entries and merges are strings over that alphabet, so a pre-token is first turned into its
UTF-8 bytes, each byte into its character, and then merged.

Merging follows the Hugging Face / tiktoken rule: repeatedly merge the adjacent pair with
the lowest rank, leftmost first, until no adjacent pair has a rank. The rank of a pair is
its index in the merge list, or (for tiktoken rank files, ``merge_ranks=None``) the rank of
the concatenated token. A short word (almost all of them) scans a list of pair ranks with
C-level ``min``; a long one uses a heap over a linked list, so a long piece (a run of
10,000 spaces, a 1 MB "word") costs O(n log n), not O(n^2).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from itertools import chain

import numpy as np

from inferpath.tokenizer.merges import MergeRanks
from inferpath.tokenizer.native import MAX_WORD as NATIVE_MAX_WORD
from inferpath.tokenizer.native import NativeMerger


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


# Words up to this many symbols merge by scanning a list of ranks (``_merge_short``), longer
# ones through a heap (``_merge_long``); measured crossover on mixed text.
SHORT_WORD = 64
_NO_RANK = 1 << 62  # above every real rank
ID_SPAN = 1 << 24  # token ids below this fit the id-pair keys of the fast path
_ID_MASK = (1 << 32) - 1

BYTE_TO_CHAR: list[str] = _bytes_to_unicode()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate table: a latin-1 decoded byte string -> its byte-level characters
_LATIN1_TO_BYTE_CHARS = {b: BYTE_TO_CHAR[b] for b in range(256)}


def bytes_to_piece(data: bytes) -> str:
    """Raw bytes -> the byte-level string a vocabulary stores."""
    return data.decode("latin-1").translate(_LATIN1_TO_BYTE_CHARS)


# str.translate table: a byte-level character -> the latin-1 character of its byte; a
# character below 256 outside the table -> its UTF-8 bytes as latin-1 characters (so that
# encoding the result as latin-1 gives piece_to_bytes's answer for every piece that has no
# character above 255 outside the table)
_PIECE_TO_LATIN1 = {cp: chr(cp).encode("utf-8").decode("latin-1") for cp in range(256)}
_PIECE_TO_LATIN1.update({ord(c): chr(b) for b, c in enumerate(BYTE_TO_CHAR)})


def piece_to_bytes(piece: str) -> bytes:
    """Byte-level vocabulary string -> raw bytes. Characters outside the table keep their
    UTF-8 form (vocabularies sometimes hold such entries; they are never produced by BPE)."""
    try:
        return piece.translate(_PIECE_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:  # a character above 255 outside the table: one by one
        pass
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
        merge_ranks: Mapping[tuple[str, str], int] | None,
        ignore_merges: bool = False,
        max_cache_size: int = 200_000,
        native_enabled: bool = True,
        id_table: np.ndarray | None = None,
    ):
        self.vocab = vocab
        self.merge_ranks = merge_ranks
        self.ignore_merges = ignore_merges
        self.max_cache_size = max_cache_size
        self.cache: dict[str, list[int]] = {}
        self.id_table = self.build_id_table() if id_table is None else id_table
        self._byte_ids = [vocab.get(char) for char in BYTE_TO_CHAR]
        self._pair_dict: dict[int, int] | None = None  # id_table as a dict, on first use
        self._native = None  # the C merge loop (native.py), when it builds here
        if self.id_table is not None and native_enabled:
            try:
                self._native = NativeMerger(self.id_table, self._byte_ids)
            except OSError:
                self._native = None

    def build_id_table(self) -> np.ndarray | None:
        """The merge table over ids, for the fast paths (``_merge_ids``, the native loop):
        (2, num_pairs) int64, row 0 the keys ``left_id * ID_SPAN + right_id``, row 1 the
        values ``rank << 32 | merged_id``, one per pair (its first rank).

        None (string path only) for tiktoken ranks, or when a merge's result or side is not
        in the vocabulary (the string path then reproduces the reference's handling). A
        loader may pass the table it built before (``id_table``): building is most of a
        vocabulary's load.
        """
        vocab = self.vocab
        if self.merge_ranks is None or max(vocab.values(), default=0) >= ID_SPAN:
            return None
        table: dict[int, int] = {}
        if isinstance(self.merge_ranks, MergeRanks):  # the merge list: its dict stays unbuilt
            triples = self.merge_ranks.triples()
        else:
            triples = ((left, right, rank) for (left, right), rank in self.merge_ranks.items())
        for left, right, rank in triples:
            left_id, right_id, merged_id = vocab.get(left), vocab.get(right), vocab.get(left + right)
            if left_id is None or right_id is None or merged_id is None:
                return None
            table.setdefault(left_id * ID_SPAN + right_id, rank << 32 | merged_id)
        return np.array([list(table), list(table.values())], dtype=np.int64).reshape(2, len(table))

    @property
    def _pair_table(self) -> dict[int, int]:
        """``id_table`` as a dict (key -> value) for the Python loop, built on first use:
        with the native loop it is rarely needed (~8 MB for 48k merges)."""
        if self._pair_dict is None:
            keys, values = self.id_table.tolist()
            self._pair_dict = dict(zip(keys, values))
        return self._pair_dict

    def encode_pieces(self, pieces: list[str]) -> list[int]:
        """The ids of consecutive pre-tokens. The hot path: one cache lookup per piece, done by
        ``map`` in C; only misses run BPE."""
        get = self.cache.get
        piece_ids = list(map(get, pieces))
        if None in piece_ids:
            if self._native is not None:
                # each distinct miss once (a long text repeats its words)
                self._encode_missing_natively(list(dict.fromkeys(
                    p for p, ids in zip(pieces, piece_ids) if ids is None)))
            for i, ids in enumerate(piece_ids):
                if ids is None:
                    piece_ids[i] = get(pieces[i]) or self.encode_piece(pieces[i])
        return list(chain.from_iterable(piece_ids))

    def _encode_missing_natively(self, missing: list[str]) -> None:
        """Merge the short cache misses in one native call and cache them, and the
        whole-token words under ``ignore_merges`` as their one id; long words and
        unmappable bytes are left to ``encode_piece``."""
        words: dict[str, bytes] = {}
        whole: dict[str, list[int]] = {}  # under ignore_merges: pre-tokens that are tokens
        vocab = self.vocab
        for piece in missing:
            data = piece.encode("utf-8")
            if self.ignore_merges and (token_id := vocab.get(bytes_to_piece(data))) is not None:
                whole[piece] = [token_id]
            elif len(data) <= NATIVE_MAX_WORD:
                words[piece] = data
        merged = self._native.merge_words(list(words.values())) if words else []
        if merged is None:
            words, merged = {}, []
        if len(self.cache) + len(words) + len(whole) > self.max_cache_size:
            self.cache.clear()
        self.cache.update(whole)
        self.cache.update(zip(words, merged))

    def encode_piece(self, piece: str) -> list[int]:
        """The ids of one pre-token (cached)."""
        data = piece.encode("utf-8")
        piece_ids = None
        if self.id_table is not None and len(data) <= SHORT_WORD:
            piece_ids = self._merge_ids(data)
        if piece_ids is None:
            vocab = self.vocab
            word = bytes_to_piece(data)
            # NOTE: a byte missing from the vocabulary (SmolLM2 has no 0x00..0x08, 0xF5..0xFF...)
            # is dropped before the merges, as Hugging Face tokenizers' BPE drops a character with
            # no id (and no unk token) while it builds the word: its neighbours then meet, and may
            # merge ('"\x06{' is one token, '"{', there). Under ignore_merges a whole word that is
            # a token stays one (merge() checks it first).
            if not (self.ignore_merges and word in vocab):
                word = "".join(char for char in word if char in vocab)
            piece_ids = [vocab[s] for s in self.merge(word) if s in vocab]
        if len(self.cache) >= self.max_cache_size:
            self.cache.clear()
        self.cache[piece] = piece_ids
        return piece_ids

    def _merge_ids(self, data: bytes) -> list[int] | None:
        """``merge`` over ids for a short word: the same merges in the same order (lowest
        rank, leftmost first), on ints (a pair key is one int: cheap to hash). None when a
        byte is not in the vocabulary or the word is a whole token under ``ignore_merges``:
        the string path decides those."""
        ids = list(map(self._byte_ids.__getitem__, data))
        if None in ids:
            return None
        if len(ids) == 1:
            return ids
        if self.ignore_merges and bytes_to_piece(data) in self.vocab:
            return None
        get = self._pair_table.get
        ranks = [get(a * ID_SPAN + b, _NO_RANK) for a, b in zip(ids, ids[1:])]  # pair (i, i + 1)
        while True:
            best = min(ranks)
            if best == _NO_RANK:
                return ids
            i = ranks.index(best)  # the leftmost pair of the lowest rank
            merged = best & _ID_MASK
            ids[i:i + 2] = (merged,)
            del ranks[i]
            if not ranks:
                return ids
            if i < len(ranks):  # (merged, the id after it)
                ranks[i] = get(merged * ID_SPAN + ids[i + 1], _NO_RANK)
            if i:  # (the id before it, merged)
                ranks[i - 1] = get(ids[i - 1] * ID_SPAN + merged, _NO_RANK)

    def merge(self, word: str) -> list[str]:
        """Apply merges to a byte-level string; returns the final symbols."""
        if len(word) <= 1 or (self.ignore_merges and word in self.vocab):
            return [word] if word else []
        if len(word) <= SHORT_WORD:
            return self._merge_short(word)
        return self._merge_long(word)

    def _merge_short(self, word: str) -> list[str]:
        """The merge loop for a short word: one list of pair ranks, the lowest found by
        ``min`` and ``index`` (C loops). O(n^2), fastest below SHORT_WORD symbols."""
        symbols = list(word)
        if self.merge_ranks is None:  # tiktoken: the rank of the concatenation
            vocab_get = self.vocab.get

            def rank_of(left: str, right: str) -> int:
                rank = vocab_get(left + right)
                return _NO_RANK if rank is None else rank
        else:
            pair_get = self.merge_ranks.get

            def rank_of(left: str, right: str) -> int:
                return pair_get((left, right), _NO_RANK)

        ranks = [rank_of(a, b) for a, b in zip(symbols, symbols[1:])]  # ranks[i]: pair (i, i + 1)
        while True:
            best = min(ranks)
            if best == _NO_RANK:
                return symbols
            i = ranks.index(best)  # the leftmost pair of the lowest rank
            merged = symbols[i] + symbols[i + 1]
            symbols[i:i + 2] = (merged,)
            del ranks[i]
            if not ranks:
                return symbols
            if i < len(ranks):  # (merged, the symbol after it)
                ranks[i] = rank_of(merged, symbols[i + 1])
            if i > 0:  # (the symbol before it, merged)
                ranks[i - 1] = rank_of(symbols[i - 1], merged)

    def _merge_long(self, word: str) -> list[str]:
        """The merge loop for a long word: a heap of pair ranks over a linked list of
        symbols, O(n log n) (a 1 MB pre-token takes seconds, not hours)."""
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
