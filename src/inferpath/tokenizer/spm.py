"""SentencePiece BPE vocabularies as llama.cpp runs them (GGUF ``tokenizer.ggml.model = "llama"``).

Gemma, Llama 2, Mistral 7B and Phi-3 ship a SentencePiece BPE model: pieces with scores,
no merge list. Encoding a text (one segment between added tokens):

1. spaces become ``▁`` (U+2581); with ``add_space_prefix`` one ``▁`` goes in front first;
2. the text is cut into UTF-8 characters, and adjacent pairs whose concatenation is a piece
   are merged, the highest-scoring concatenation first (ties: the leftmost), until no pair
   forms a piece;
3. each remaining symbol is its piece's id, or, if no piece has that text (a character
   outside the vocabulary), one ``<0xNN>`` byte token per UTF-8 byte.

This is llama.cpp's ``llm_tokenizer_spm_session`` (llama-vocab.cpp); the tests hold it to
llama.cpp's vocab vectors and to transformers' tokenizer of the same GGUF file. Decoding is a
byte concatenation: ``▁`` is a space, ``<0xNN>`` the byte NN.
"""

from __future__ import annotations

import heapq

# GGUF token types (llama.cpp's llama_token_type)
UNKNOWN, CONTROL, USER_DEFINED, BYTE = 2, 3, 4, 6
SPACE = "\u2581"
# what llama.cpp prints for the unknown token (U+2585)
UNKNOWN_TEXT = "\u2585".encode()


class SentencePieceEncoder:
    """Score-ordered merging over a SentencePiece vocabulary (module docstring).

    ``vocab`` maps every piece text to its id (the last id where a text repeats, as
    llama.cpp's lookup table); ``encode_pieces`` takes the segments the Tokenizer hands it
    (its pre-tokenizer does not split: one segment of raw text between added tokens).
    """

    id_table = None  # (the byte-level encoder's cached merge table: nothing to cache here)

    def __init__(self, pieces: list[str], scores: list[float], token_types: list[int],
                 add_space_prefix: bool) -> None:
        self.vocab = {piece: i for i, piece in enumerate(pieces)}
        self._scores = scores
        self.add_space_prefix = add_space_prefix
        self._byte_ids: dict[int, int] = {}
        for i, (piece, kind) in enumerate(zip(pieces, token_types)):
            if kind == BYTE and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                self._byte_ids[int(piece[3:5], 16)] = i

    def encode_pieces(self, segments: list[str]) -> list[int]:
        ids: list[int] = []
        for text in segments:
            if not text:
                continue
            if self.add_space_prefix:
                text = " " + text
            ids += self._encode(text.replace(" ", SPACE))
        return ids

    def _encode(self, text: str) -> list[int]:
        # symbols: a doubly linked list of substrings text[start[i]:end[i]]
        n = len(text)
        start, end = list(range(n)), list(range(1, n + 1))
        prev, nxt = list(range(-1, n - 1)), list(range(1, n + 1))
        nxt[-1] = -1
        alive = [True] * n
        queue: list[tuple[float, int, int, int]] = []  # (-score, left, right, merged length)

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            token = self.vocab.get(text[start[left]:end[right]])
            if token is not None:
                heapq.heappush(queue, (-self._scores[token], left, right, end[right] - start[left]))

        for i in range(1, n):
            push(i - 1, i)
        while queue:
            _, left, right, length = heapq.heappop(queue)
            # stale entries: a side already merged away, or grown since it was queued
            if not (alive[left] and alive[right]) or end[right] - start[left] != length or nxt[left] != right:
                continue
            end[left] = end[right]
            alive[right] = False
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            push(prev[left], left)
            push(left, nxt[left])
        ids: list[int] = []
        i = 0
        while i >= 0:
            piece = text[start[i]:end[i]]
            token = self.vocab.get(piece)
            if token is not None:
                ids.append(token)
            else:
                ids += self._byte_fallback(piece)
            i = nxt[i]
        return ids

    def _byte_fallback(self, piece: str) -> list[int]:
        try:
            return [self._byte_ids[b] for b in piece.encode("utf-8")]
        except KeyError:
            raise ValueError(f"character {piece!r} is not in the vocabulary and the vocabulary "
                             "has no <0xNN> byte tokens to spell it") from None


def spm_token_bytes(pieces: list[str], token_types: list[int]) -> list[bytes]:
    """The bytes each id decodes to: ``▁`` a space, ``<0xNN>`` byte tokens their byte,
    the unknown token U+2585 (as llama.cpp prints it), every other piece its UTF-8 text."""
    out: list[bytes] = []
    for piece, kind in zip(pieces, token_types):
        if kind == BYTE and len(piece) == 6 and piece.startswith("<0x"):
            out.append(bytes([int(piece[3:5], 16)]))
        elif kind == UNKNOWN:
            out.append(UNKNOWN_TEXT)
        elif kind in (CONTROL, USER_DEFINED):
            out.append(piece.encode("utf-8"))
        else:
            out.append(piece.replace(SPACE, " ").encode("utf-8"))
    return out
