"""A merge list as GGUF stores it ("left right" strings), seen as a rank table.

``BytePairEncoder`` (bpe.py) takes merge ranks as a mapping (left, right) -> rank. Built
eagerly from a GGUF's 48k merges that dict costs ~10 MB and ~20 ms of every load, yet
encoding runs on the id table (``BytePairEncoder.build_id_table``, made from ``triples``
without it); only the string path (words over ``bpe.SHORT_WORD`` symbols, bytes without an
id) looks pairs up by string. ``MergeRanks`` builds the dict on its first lookup.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class MergeRanks(Mapping):
    """(left, right) -> rank over ``merges`` ("left right" strings; a pair listed twice
    keeps its first rank), the dict built on first lookup (see the module docstring)."""

    def __init__(self, merges: list[str]) -> None:
        self.merges = merges
        self._ranks: dict[tuple[str, str], int] | None = None

    def triples(self) -> Iterator[tuple[str, str, int]]:
        """(left, right, rank) of every merge, in order, duplicates included."""
        for rank, merge in enumerate(self.merges):
            left, _, right = merge.partition(" ")
            yield left, right, rank

    def _built(self) -> dict[tuple[str, str], int]:
        if self._ranks is None:
            ranks: dict[tuple[str, str], int] = {}
            for left, right, rank in self.triples():
                ranks.setdefault((left, right), rank)
            self._ranks = ranks
        return self._ranks

    def get(self, pair, default=None):
        return self._built().get(pair, default)

    def __getitem__(self, pair: tuple[str, str]) -> int:
        return self._built()[pair]

    def __iter__(self):
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())
