"""Prompt lookup (n-gram) drafts: continue the last n tokens as they continued before.

For a sequence ending in tokens t[L-n:L], find the most recent earlier place where the
same n tokens occurred (anywhere in the prompt or the output so far) and propose the up
to k tokens that followed them there; n runs from ``prompt_lookup_max`` down to
``prompt_lookup_min``, the longest match winning. Strong where the answer copies its
context (code edits, summaries, retrieval); no model, no cost when nothing matches.

Each sequence keeps an index n -> {n-gram: end of its latest occurrence}, extended by the
tokens added since its last proposal, so a proposal costs O(new tokens x n), not O(L).
The drafts are point masses (no distributions): ``spec_draft_probs`` stays None.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferpath.engine.request import Request


class _Index:
    """n-grams ending before position ``num_indexed`` of one sequence, by n."""

    def __init__(self, ns: range):
        self.by_n: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in ns}
        self.num_indexed = 0  # n-grams ending at positions <= this (exclusive end) are in

    def extend(self, tokens: Sequence[int], end: int) -> None:
        """Index every n-gram whose (exclusive) end is in (num_indexed, end]."""
        for stop in range(self.num_indexed + 1, end + 1):
            for n, grams in self.by_n.items():
                if stop >= n:
                    grams[tuple(tokens[stop - n:stop])] = stop
        self.num_indexed = max(self.num_indexed, end)


class NgramProposer:
    """Proposes drafts by prompt lookup; see the module docstring."""

    proposals_are_free = True  # a paused sequence's shadow proposals cost a dict lookup

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        self.ns = range(prompt_lookup_max, prompt_lookup_min - 1, -1)  # longest first
        self._indexes: dict[object, _Index] = {}

    def propose(self, requests: Sequence[Request], num_drafts: Sequence[int]) -> None:
        for request, k in zip(requests, num_drafts):
            request.spec_token_ids = self.lookup(request.seq_id, request.all_token_ids, k)
            request.spec_draft_probs = None

    def lookup(self, seq_id: object, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest
        suffix of ``tokens`` (of ``prompt_lookup_min..max`` tokens); [] when none."""
        index = self._indexes.get(seq_id)
        if index is None:
            index = self._indexes[seq_id] = _Index(self.ns)
        num_tokens = len(tokens)
        # every n-gram but the suffix itself (which ends at num_tokens)
        index.extend(tokens, num_tokens - 1)
        for n in self.ns:
            if n >= num_tokens:
                continue
            end = index.by_n[n].get(tuple(tokens[num_tokens - n:]))
            if end is not None:
                return list(tokens[end:end + k])
        return []

    def release(self, live_seq_ids: set) -> None:
        """Forget sequences no longer running or waiting."""
        for seq_id in [s for s in self._indexes if s not in live_seq_ids]:
            del self._indexes[seq_id]
