"""Suffix decoding drafts (Oliaro et al., arXiv 2411.04975; vLLM's ``suffix`` method): the
sequence's last tokens matched in two corpora, the continuation most occurrences share
proposed, longer where the match is longer.

The corpora:

- the request's own tokens, its prompt and its output so far (what prompt lookup reads);
- the global cache: the outputs of the requests running now (indexed as they grow: ``n``
  samples of one prompt, or the same question from two users, draft from each other) and
  of the last ``suffix_decoding_max_cached_requests`` requests that finished (an agent's
  loop repeats its own tool calls and phrasings across requests, which no single prompt
  holds); 0 turns the cache off.

For a sequence t[:L], every earlier place in a corpus where t[L-2:L] occurred (the most
recent ``CANDIDATES`` of them) is extended backwards to its match length m (at most the
tree depth D - 1). The occurrences matching at least m tokens are the ones a suffix tree's
node for t[L-m:L] counts. The draft follows, token by token, the continuation most of them
share; the occurrences that took another leave, and the draft's probability is the product
of the shares. It stops when that probability falls below ``min_token_prob``, at
min(k, floor(max_spec_factor * m), D - m) tokens, or where no occurrence continues. Each
match length a corpus offers is tried (and the one balancing factor * m against D - m);
a draft's score is the sum of its tokens' probabilities (the expected number accepted if the
frequencies were the target's), and the best draft of the two corpora is proposed.

Matches shorter than two tokens propose nothing. The search is over a bounded window of
occurrences, so a corpus of any size costs each proposal at most ``CANDIDATES`` backward
comparisons per corpus; the frequencies are those of the window (the most recent ones).

Memory: the global cache holds each finished output's tokens (8 bytes each) and one index
entry per token, keyed by its pair (an int where the pair occurred once, else an array of
8-byte entries): measured 17 bytes a cached token on repetitive text (prose and code
repeated) and 112 on tokens whose pairs almost never repeat, the worst case: 500-token
outputs x the default 10000 requests are then ~0.6 GB (``max_cached_requests`` bounds it).
Finished outputs (and aborted ones) leave oldest first, filtered out of the index.
The drafts are point masses (no distributions): ``spec_draft_probs`` stays None.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence

from inferpath.engine.request import Request

CANDIDATES = 64  # occurrences of the last two tokens examined per corpus and proposal
_SHIFT = 32      # a global index entry: (sequence number << 32) | end; a pair's key: (a << 32) | b


def _pair(a: int, b: int) -> int:
    return (a << _SHIFT) | b


class _Draft:
    __slots__ = ("tokens", "score")

    def __init__(self, tokens: list[int], score: float):
        self.tokens, self.score = tokens, score


def _follow(occurrences: list[tuple[Sequence[int], int]], limit: int, min_prob: float) -> _Draft:
    """The continuation most of ``occurrences`` (sequence, index of the token after the
    match) share, up to ``limit`` tokens, while its probability stays >= ``min_prob``."""
    tokens: list[int] = []
    prob, score = 1.0, 0.0
    while len(tokens) < limit and occurrences:
        counts: dict[int, int] = {}
        for seq, at in occurrences:  # most recent first: ties go to the most recent
            if at < len(seq):
                counts[seq[at]] = counts.get(seq[at], 0) + 1
        if not counts:
            break
        token = max(counts, key=counts.__getitem__)
        share = prob * counts[token] / len(occurrences)  # an occurrence that ends there counts
        if share < min_prob:
            break
        tokens.append(token)
        prob, score = share, score + share
        occurrences = [(seq, at + 1) for seq, at in occurrences if at < len(seq) and seq[at] == token]
    return _Draft(tokens, score)


class _Matcher:
    """The search shared by both corpora: ``best(context, occurrences)``."""

    def __init__(self, depth: int, factor: float, min_prob: float):
        self.depth, self.factor, self.min_prob = depth, factor, min_prob
        self.balanced = max(2, int(depth / (1.0 + factor)))  # factor * m == depth - m

    def best(self, context: Sequence[int], occurrences: list[tuple[Sequence[int], int]], k: int) -> _Draft:
        """occurrences: (sequence, end) where sequence[end - 2:end] == context[-2:], most
        recent first; each sequence's tokens from ``end`` on are its continuation."""
        n = len(context)
        longest = self.depth - 1
        matched: list[tuple[int, Sequence[int], int]] = []
        for seq, end in occurrences:
            if end >= len(seq):
                continue  # nothing follows (the context's own end)
            top = min(longest, end, n)
            window = seq[end - top:end]
            if (window if isinstance(window, list) else window.tolist()) == context[n - top:n]:
                m = top
            else:
                m = 2
                while m < top and seq[end - m - 1] == context[n - m - 1]:
                    m += 1
            matched.append((m, seq, end))
        if not matched:
            return _Draft([], 0.0)
        lengths = sorted({m for m, _, _ in matched}, reverse=True)[:6]
        if self.balanced < lengths[0] and self.balanced not in lengths:
            lengths.append(self.balanced)
        best = _Draft([], 0.0)
        for m in lengths:
            limit = min(k, int(self.factor * m), self.depth - m)
            if limit <= 0:
                continue
            draft = _follow([(seq, end) for mm, seq, end in matched if mm >= m], limit, self.min_prob)
            if draft.score > best.score:
                best = draft
        return best


class _Local:
    """One request's own tokens: where each pair of tokens ended, by pair."""

    def __init__(self) -> None:
        self.ends: dict[int, list[int]] = {}  # _pair(a, b) -> ends
        self.num_indexed = 1  # pairs ending at positions (exclusive) <= this are in

    def occurrences(self, tokens: Sequence[int]) -> list[tuple[Sequence[int], int]]:
        for end in range(self.num_indexed + 1, len(tokens) + 1):
            self.ends.setdefault(_pair(tokens[end - 2], tokens[end - 1]), []).append(end)
        self.num_indexed = max(self.num_indexed, len(tokens))
        if len(tokens) < 2:
            return []
        ends = self.ends.get(_pair(tokens[-2], tokens[-1]), ())
        return [(tokens, end) for end in reversed(ends[-CANDIDATES - 1:])]


class _GlobalCache:
    """The outputs of requests: those running (indexed as they grow, so that concurrent
    requests, ``n`` samples of one prompt among them, draft from each other) and the last
    ``max_requests`` that finished. Each pair of tokens' ends, by pair, in indexing order."""

    def __init__(self, max_requests: int):
        self.max_requests = max_requests
        self.by_number: dict[int, Sequence[int]] = {}  # a running output's own list; a finished one's array
        self.active: dict[object, tuple[int, list[int]]] = {}  # seq id -> (number, its output list)
        self.indexed: dict[int, int] = {}  # number -> pairs ending at positions <= this are in
        self.finished: deque[int] = deque()  # numbers, oldest first
        # _pair(a, b) -> (number << _SHIFT) | end: one entry as an int, more as an array, oldest first
        self.ends: dict[int, int | array] = {}
        self.next_number = 0

    def track(self, seq_id: object, output: list[int]) -> None:
        """Index ``output`` (a running sequence's list, which grows) up to its end."""
        if self.max_requests == 0:
            return
        entry = self.active.get(seq_id)
        if entry is None:
            entry = self.active[seq_id] = (self.next_number, output)
            self.by_number[self.next_number] = output
            self.indexed[self.next_number] = 1
            self.next_number += 1
        self._index(*entry)

    def _index(self, number: int, output: Sequence[int]) -> None:
        first = self.indexed[number] + 1
        for end in range(first, len(output) + 1):
            key, entry = _pair(output[end - 2], output[end - 1]), (number << _SHIFT) | end
            entries = self.ends.get(key)
            if entries is None:
                self.ends[key] = entry  # most pairs occur once: no array for them
            elif isinstance(entries, int):
                self.ends[key] = array("q", (entries, entry))
            else:
                entries.append(entry)
        self.indexed[number] = max(self.indexed[number], len(output))

    def finish(self, seq_id: object) -> None:
        """The sequence left: its output, indexed to the end, kept as an array; the oldest
        finished outputs past ``max_requests`` forgotten."""
        entry = self.active.pop(seq_id, None)
        if entry is None:
            return
        number, output = entry
        self._index(number, output)
        self.by_number[number] = array("l", output)
        self.finished.append(number)
        while len(self.finished) > self.max_requests:
            self._evict(self.finished.popleft())

    def _evict(self, number: int) -> None:
        stored = self.by_number.pop(number)
        del self.indexed[number]
        for key in {_pair(stored[end - 2], stored[end - 1]) for end in range(2, len(stored) + 1)}:
            entries = self.ends[key]
            kept = array("q", (e for e in ((entries,) if isinstance(entries, int) else entries)
                               if e >> _SHIFT != number))
            if kept:
                self.ends[key] = kept
            else:
                del self.ends[key]

    @property
    def num_tokens(self) -> int:
        """Tokens held, running and finished outputs."""
        return sum(len(output) for output in self.by_number.values())

    @property
    def outputs(self) -> list[Sequence[int]]:
        """The finished outputs held, oldest first."""
        return [self.by_number[number] for number in self.finished]

    def occurrences(self, tokens: Sequence[int]) -> list[tuple[Sequence[int], int]]:
        if len(tokens) < 2:
            return []
        entries = self.ends.get(_pair(tokens[-2], tokens[-1]), ())
        if isinstance(entries, int):
            entries = (entries,)
        mask = (1 << _SHIFT) - 1
        return [(self.by_number[e >> _SHIFT], e & mask) for e in reversed(entries[-CANDIDATES:])]


class SuffixProposer:
    """Proposes drafts by suffix decoding; see the module docstring."""

    proposals_are_free = True  # a paused sequence's shadow proposals cost a lookup

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1):
        # k comes with each proposal (the Speculator's, at most num_speculative_tokens)
        self.matcher = _Matcher(max_tree_depth, max_spec_factor, min_token_prob)
        self.cache = _GlobalCache(max_cached_requests)
        self._locals: dict[object, _Local] = {}

    @classmethod
    def from_config(cls, config) -> SuffixProposer:
        return cls(config.suffix_decoding_max_tree_depth, config.suffix_decoding_max_cached_requests, config.suffix_decoding_max_spec_factor,
                   config.suffix_decoding_min_token_prob)

    def clear_cache(self) -> None:
        """Forget every cached output (benchmarks: each run against the same cache)."""
        self.cache = _GlobalCache(self.cache.max_requests)

    def observe(self, running: Sequence[Request]) -> None:
        """The engine's running sequences after a step: their outputs so far enter the
        cache (and stay when they leave: ``release``)."""
        for request in running:
            self.cache.track(request.seq_id, request.output_token_ids)

    def propose(self, requests: Sequence[Request], num_drafts: Sequence[int]) -> None:
        for request, k in zip(requests, num_drafts):
            request.spec_token_ids = self.lookup(request.seq_id, request.all_token_ids, k)
            request.spec_draft_probs = None

    def lookup(self, seq_id: object, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k drafted tokens past ``tokens`` (the sequence's prompt and output); []
        when neither corpus holds its last two tokens followed by anything."""
        local = self._locals.get(seq_id)
        if local is None:
            local = self._locals[seq_id] = _Local()
        own = self.matcher.best(tokens, local.occurrences(tokens), k)
        cached = self.matcher.best(tokens, self.cache.occurrences(tokens), k)
        return (cached if cached.score > own.score else own).tokens

    def release(self, live_seq_ids: set) -> None:
        """Keep the outputs of sequences no longer running or waiting as finished; forget
        their own indexes."""
        for seq_id in [s for s in self.cache.active if s not in live_seq_ids]:
            self.cache.finish(seq_id)
        for seq_id in [s for s in self._locals if s not in live_seq_ids]:
            del self._locals[seq_id]
