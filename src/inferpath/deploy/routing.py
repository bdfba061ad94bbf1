"""Which replica serves a request: prefix affinity balanced against load, or round-robin.

Imports neither Ray nor torch, so the policy is tested on its own.

The router keeps, per replica, an approximate set of the prompt prefixes it has sent there
(as SGLang's cache-aware router does, over text rather than token ids, so the ingress needs
no tokenizer): a prompt's text is cut into chunks of ``chunk_chars`` characters and each
chunk gets a hash chained over its parent's, the way the engine's prefix cache hashes
blocks of token ids. A replica "holds" a prefix of ``k`` chunks when the k-th chained hash
is in its set. The set is an LRU bounded by ``max_chunks_per_replica``, standing in for
the replica's own eviction (oldest freed blocks first).

Replicas ``spill_after..`` (when set) are spares that autoscale from zero. A spare is
*cold* (scaled to zero: no process, no cache) until the ingress wakes it; the router then
learns it (``mark_warm``) and forgets it again when Serve scales it back to zero
(``mark_cold`` drops its prefix set). A cold spare is never chosen; ``spare_to_wake``
names the one to start when every running replica is ``spill_at`` deep, and a running
spare takes requests only then (see ``candidates``), so it idles, and is scaled down,
once the queue is shallow again.

Choice, for a request with text chunks h_1..h_n:

    candidates   healthy replicas with fewer than ``max_inflight`` requests in flight
    match(r)     the longest k with h_k in replica r's set
    load(r)      requests in flight at r (the ingress sees every one of them)
    prefix       the replica with the longest match, when that match covers at least
                 ``min_match_chars`` and its load is within ``balance_slack`` of the least
                 loaded candidate's (a hot prefix must not pile every request on one
                 replica); ties to the less loaded
    load         otherwise, the least loaded candidate; ties by round-robin order

``RouteDecision`` says which replica and why, for the trace and the response headers.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Sequence

POLICIES = ("prefix", "round_robin")


def chunk_hashes(text: str, chunk_chars: int) -> list[bytes]:
    """Chained hashes of the full ``chunk_chars``-character chunks of ``text``, in order.

    hash_k depends on chunks 1..k, so equal hashes mean equal prefixes (up to collisions,
    which only cost a worse routing choice, never a wrong answer: the engine compares
    token ids before it reuses a block)."""
    hashes, parent = [], b""
    for start in range(0, len(text) - chunk_chars + 1, chunk_chars):
        parent = hashlib.blake2b(parent + text[start:start + chunk_chars].encode("utf-8", "surrogatepass"),
                                 digest_size=12).digest()
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class RouteDecision:
    """The replica chosen for one request and why (``reason``: prefix, load or round_robin)."""

    replica: str
    reason: str
    matched_chars: int  # of the prompt's text, found in the replica's prefix set
    load: int  # requests in flight at the replica when it was chosen

    def describe(self) -> str:
        return f"{self.replica} ({self.reason}, {self.matched_chars} chars matched, load {self.load})"


class PrefixIndex:
    """One replica's approximate set of prefix chunk hashes, least recently used evicted."""

    def __init__(self, max_chunks: int) -> None:
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
        self.max_chunks = max_chunks
        self._hashes: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hashes)

    def match(self, hashes: Sequence[bytes]) -> int:
        """How many leading hashes of ``hashes`` this replica holds (a binary search would
        do since the chain is prefix-closed; a linear scan keeps it obvious)."""
        count = 0
        for digest in hashes:
            if digest not in self._hashes:
                break
            count += 1
        return count

    def insert(self, hashes: Iterable[bytes]) -> None:
        for digest in hashes:
            self._hashes[digest] = None
            self._hashes.move_to_end(digest)
        while len(self._hashes) > self.max_chunks:
            self._hashes.popitem(last=False)

    def clear(self) -> None:
        self._hashes.clear()


class Router:
    """Chooses replicas and counts requests in flight per replica (see the module docstring).

    Invariant: ``inflight[r]`` is the number of requests ``choose`` gave to ``r`` minus those
    ``release``d; a replica marked down or cold is never chosen until marked up (warm) again,
    and its prefix set is dropped (a restarted or re-started replica's cache is empty).
    Spares start cold; the others are never cold.
    """

    def __init__(self, replicas: Sequence[str], policy: str = "prefix", chunk_chars: int = 64,
                 max_chunks_per_replica: int = 4096, min_match_chars: int = 64,
                 balance_slack: int = 4, max_inflight: int = 32, spill_after: int | None = None,
                 spill_at: int = 8) -> None:
        if policy not in POLICIES:
            raise ValueError(f"routing policy {policy!r} is not one of {', '.join(POLICIES)}")
        if not replicas:
            raise ValueError("a router needs at least one replica")
        self.policy = policy
        self.replicas = list(replicas)
        self.chunk_chars = chunk_chars
        self.min_match_chars = min_match_chars
        self.balance_slack = balance_slack
        self.max_inflight = max_inflight
        self.spill_after = spill_after
        self.spill_at = spill_at
        self.inflight = {name: 0 for name in self.replicas}
        self.down: set[str] = set()
        self.spares = self.replicas[spill_after:] if spill_after is not None else []
        self.cold: set[str] = set(self.spares)  # scaled to zero: not chosen, no prefix set
        self.waking: set[str] = set()  # cold spares asked to start, not answering yet
        self._indexes = {name: PrefixIndex(max_chunks_per_replica) for name in self.replicas}
        self._order = itertools.cycle(range(len(self.replicas)))
        self.num_routed = {(name, reason): 0 for name in self.replicas
                           for reason in ("prefix", "load", "round_robin", "owner")}

    def candidates(self, exclude: Iterable[str] = ()) -> list[str]:
        """Healthy running replicas with room. With ``spill_after`` k, replicas k.. are
        spares: a cold one is never a candidate, an idle running one only once every other
        candidate has ``spill_at`` requests in flight (the queue is deep)."""
        excluded = set(exclude) | self.down | self.cold
        free = [r for r in self.replicas if r not in excluded and self.inflight[r] < self.max_inflight]
        if not self.spares:
            return free
        busy = [r for r in free if r not in self.spares or self.inflight[r] > 0]
        if all(self.inflight[r] >= self.spill_at for r in busy):
            return free
        return busy

    def is_deep(self) -> bool:
        """Every running healthy replica has ``spill_at`` requests in flight (or none runs)."""
        running = [r for r in self.replicas if r not in self.down and r not in self.cold]
        return all(self.inflight[r] >= self.spill_at for r in running)

    def spare_to_wake(self) -> str | None:
        """The cold spare to start now: the first one, when the queue is deep, no running
        spare is idle and none is starting already (one at a time); else None."""
        if self.waking or not self.is_deep():
            return None
        if any(self.inflight[r] == 0 for r in self.spares if r not in self.cold and r not in self.down):
            return None  # an idle running spare takes the next request
        cold = [r for r in self.spares if r in self.cold and r not in self.down]
        if cold:
            self.waking.add(cold[0])
            return cold[0]
        return None

    def mark_warm(self, replica: str) -> None:
        """``replica`` (a spare) runs: it is chosen from now on, with an empty prefix set."""
        self.cold.discard(replica)
        self.waking.discard(replica)

    def mark_cold(self, replica: str) -> None:
        """``replica`` (a spare) was scaled to zero (or failed to start): forget its prefixes."""
        if replica not in self.spares:
            raise ValueError(f"{replica!r} is not a spare replica ({', '.join(self.spares) or 'none'})")
        self.cold.add(replica)
        self.waking.discard(replica)
        self._indexes[replica].clear()

    def num_prefix_chunks(self, replica: str) -> int:
        """How many chunk hashes the router believes ``replica`` holds."""
        return len(self._indexes[replica])

    def choose(self, text: str, exclude: Iterable[str] = ()) -> RouteDecision | None:
        """The replica for a request whose prompt reads ``text``, or None when every healthy
        replica is full (the caller waits and asks again). Counts it in flight."""
        candidates = self.candidates(exclude)
        if not candidates:
            return None
        hashes = chunk_hashes(text, self.chunk_chars)
        start = next(self._order)
        rotated = self.replicas[start:] + self.replicas[:start]
        order = [r for r in rotated if r in candidates]  # round-robin order among candidates
        if self.policy == "round_robin":
            decision = self._decide(order[0], "round_robin", hashes)
        else:
            least = min(self.inflight[r] for r in order)
            matches = {r: self._indexes[r].match(hashes) for r in order}
            best = max(order, key=lambda r: (matches[r], -self.inflight[r]))
            affine = (matches[best] * self.chunk_chars >= self.min_match_chars
                      and self.inflight[best] <= least + self.balance_slack)
            if affine:
                decision = self._decide(best, "prefix", hashes, matches[best])
            else:
                decision = self._decide(min(order, key=lambda r: self.inflight[r]), "load", hashes,
                                        matches[min(order, key=lambda r: self.inflight[r])])
        self._indexes[decision.replica].insert(hashes)
        return decision

    def choose_owner(self, replica: str, text: str) -> RouteDecision | None:
        """``replica`` itself, for a request that continues a response it made (a Responses
        ``previous_response_id``: the stored conversation lives in that replica's store), or
        None when it is down or full (the caller then routes as usual or waits)."""
        if replica not in self.candidates():
            return None
        hashes = chunk_hashes(text, self.chunk_chars)
        decision = self._decide(replica, "owner", hashes)
        self._indexes[replica].insert(hashes)
        return decision

    def _decide(self, replica: str, reason: str, hashes: list[bytes], matched: int | None = None) -> RouteDecision:
        if matched is None:
            matched = self._indexes[replica].match(hashes)
        decision = RouteDecision(replica, reason, matched * self.chunk_chars, self.inflight[replica])
        self.inflight[replica] += 1
        self.num_routed[(replica, reason)] += 1
        return decision

    def release(self, replica: str) -> None:
        self.inflight[replica] = max(0, self.inflight[replica] - 1)

    def mark_down(self, replica: str) -> None:
        self.down.add(replica)
        self._indexes[replica].clear()

    def mark_up(self, replica: str) -> None:
        self.down.discard(replica)
