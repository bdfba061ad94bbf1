"""Learn a byte-level BPE from a corpus, from the 256 bytes up, and write it as tokenizer.json.

The algorithm: pre-tokenize the corpus (the same patterns encoding will use, so no merge
crosses a pre-token boundary), count each distinct pre-token once with its frequency, then
repeatedly merge the most frequent adjacent pair. Ties are broken by the pair's bytes
(smallest ``(left, right)`` first), so the result depends only on the corpus, the pattern
and the vocabulary size.

Pair counts are kept up to date incrementally: merging a pair only touches the words that
contain it (``words_with_pair``), and a max-heap with lazy deletion finds the next pair.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path

from inferpath.tokenizer.bpe import BytePairEncoder, bytes_to_piece
from inferpath.tokenizer.pretokenize import PreTokenizer, patterns_for
from inferpath.tokenizer.tokenizer import AddedToken, Tokenizer

NUM_BYTES = 256


def _pairs(word: list[int]) -> Counter:
    return Counter(pairwise(word))


def _merge_word(word: list[int], left: int, right: int, new_id: int) -> list[int]:
    merged, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == left and word[i + 1] == right:
            merged.append(new_id)
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return merged


def learn_merges(
    word_counts: dict[str, int], num_merges: int
) -> tuple[list[bytes], list[tuple[int, int]]]:
    """(token bytes by id, merges as id pairs) after up to ``num_merges`` merges.

    Stops early when no pair occurs twice. A merge whose bytes already form a token (the
    same string reached by another split) adds a merge rule but no new token.
    """
    token_bytes = [bytes([b]) for b in range(NUM_BYTES)]
    id_of_bytes = {b: i for i, b in enumerate(token_bytes)}
    words = [list(piece.encode("utf-8")) for piece in word_counts]
    counts = list(word_counts.values())
    pair_counts: Counter = Counter()
    words_with_pair: dict[tuple[int, int], set[int]] = defaultdict(set)
    for index, word in enumerate(words):
        for pair, n in _pairs(word).items():
            pair_counts[pair] += n * counts[index]
            words_with_pair[pair].add(index)

    def heap_entry(pair):
        return (-pair_counts[pair], token_bytes[pair[0]], token_bytes[pair[1]], pair)

    heap = [heap_entry(pair) for pair in pair_counts]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    while heap and len(merges) < num_merges:
        neg_count, _, _, pair = heapq.heappop(heap)
        if -neg_count != pair_counts.get(pair, 0):
            continue  # NOTE: stale entry; the current count was pushed when it changed
        if -neg_count < 2:
            break
        merged_bytes = token_bytes[pair[0]] + token_bytes[pair[1]]
        new_id = id_of_bytes.get(merged_bytes)
        if new_id is None:
            new_id = len(token_bytes)
            token_bytes.append(merged_bytes)
            id_of_bytes[merged_bytes] = new_id
        merges.append(pair)
        changed = set()
        for index in words_with_pair.pop(pair, ()):
            word = words[index]
            new_word = _merge_word(word, pair[0], pair[1], new_id)
            if len(new_word) == len(word):
                continue
            count = counts[index]
            for old_pair, n in _pairs(word).items():
                pair_counts[old_pair] -= n * count
                changed.add(old_pair)
            for new_pair, n in _pairs(new_word).items():
                pair_counts[new_pair] += n * count
                words_with_pair[new_pair].add(index)
                changed.add(new_pair)
            words[index] = new_word
        pair_counts.pop(pair, None)
        for changed_pair in changed:
            if pair_counts.get(changed_pair, 0) > 0:
                heapq.heappush(heap, heap_entry(changed_pair))
            else:
                pair_counts.pop(changed_pair, None)
    return token_bytes, merges


def train_bpe(
    text: str, vocab_size: int, pattern: str = "gpt2", special_tokens: list[str] = ()
) -> Tokenizer:
    """A byte-level BPE Tokenizer learned from ``text`` with ``vocab_size`` ids in total
    (256 bytes + merges + ``special_tokens``), pre-tokenized with the named pattern."""
    num_merges = vocab_size - NUM_BYTES - len(special_tokens)
    if num_merges < 0:
        raise ValueError(
            f"vocab_size {vocab_size} is below the minimum {NUM_BYTES + len(special_tokens)} "
            f"(256 bytes + {len(special_tokens)} special tokens)"
        )
    pre_tokenizer = PreTokenizer(patterns_for(pattern))
    word_counts = Counter(pre_tokenizer.split(text))
    token_bytes, merges = learn_merges(word_counts, num_merges)
    pieces = [bytes_to_piece(b) for b in token_bytes]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    merge_ranks = {}
    for rank, (left, right) in enumerate(merges):
        merge_ranks.setdefault((pieces[left], pieces[right]), rank)
    added = [
        AddedToken(content, len(pieces) + i, special=True)
        for i, content in enumerate(special_tokens)
    ]
    return Tokenizer(
        pieces=pieces + list(special_tokens),
        encoder=BytePairEncoder(vocab, merge_ranks),
        pre_tokenizer=pre_tokenizer,
        added_tokens=added,
        bos_token_id=None,
        eos_token_id=added[0].id if added else None,
        eos_token_ids=frozenset(t.id for t in added[:1]),
        add_bos_token=False,
        name=f"bpe-{pattern}-{vocab_size}",
    )


def to_tokenizer_json(tokenizer: Tokenizer) -> dict:
    """The Hugging Face tokenizer.json form of a Tokenizer made by ``train_bpe``."""
    encoder = tokenizer.encoder
    if encoder.merge_ranks is None or tokenizer.normalizer is not None:
        raise ValueError(
            "only merge-list tokenizers without a normalizer can be written as tokenizer.json"
        )
    splits = [
        {
            "type": "Split",
            "pattern": {"Regex": p},
            "behavior": "Isolated",
            "invert": False,
        }
        for p in tokenizer.pre_tokenizer.patterns
    ]
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": False,
    }
    merges = sorted(encoder.merge_ranks.items(), key=lambda item: item[1])
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": t.id,
                "content": t.content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": t.special,
            }
            for t in tokenizer.added_tokens
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": splits + [byte_level]},
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": encoder.ignore_merges,
            "vocab": dict(encoder.vocab),
            "merges": [f"{left} {right}" for (left, right), _ in merges],
        },
    }


def save_tokenizer_json(tokenizer: Tokenizer, out_dir: str | Path) -> Path:
    """Write ``out_dir/tokenizer.json``; returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tokenizer.json"
    path.write_text(
        json.dumps(to_tokenizer_json(tokenizer), ensure_ascii=False, indent=1),
        encoding="utf-8",
    )
    return path
