"""Block manager: which KV-cache blocks each sequence owns. Imports no torch.

The KV cache (cache/kv.py) is a pool of ``num_blocks`` blocks of ``block_size`` token
slots each. This module hands those blocks out by id; only the runner turns the ids into
slot mappings and block tables. It knows nothing of tensors.

Automatic prefix caching: once a block is full of *computed* tokens it gets a hash chained
over (parent block's hash, the block's token ids), so equal hashes mean equal prefixes.
A new sequence whose leading full blocks are already cached takes them (ref count + 1)
and computes only the rest. Blocks of a finished or preempted sequence go back to the free
queue but keep their hash, so they can still be hit until they are reused for something
else; the free queue is least-recently-freed first, so the oldest cached blocks are
evicted first.

Invariants:
- a block is either in use (``ref_count > 0``) or in the free queue, never both;
- a block is in ``_cached`` (hash -> block id) iff its ``block_hash`` is not None;
- a cached block's contents never change while it is cached (only full blocks of
  computed tokens are hashed, and a sequence only ever appends past them).

State slots: a model with linear-attention layers (Qwen3-Next) also keeps a fixed-size
state per running sequence (cache/kv.py holds the tensors). ``num_state_slots`` slots are
one more resource: a sequence takes one with its blocks (``allocate``) and gives it back
with them (``free``: finish, abort, preemption; recompute rebuilds the state). Prefix
caching is off for such models: a cached block holds K/V, not the state after it, so a hit
could not resume the linear layers (``prefix_caching_off_reason`` says so).
Invariant: every slot is either free or owned by exactly one sequence with blocks.

NOTE: hashes are Python's ``hash`` of an int tuple, which is deterministic across
processes (PYTHONHASHSEED only affects str/bytes). A hit also compares the block's token
ids, so a hash collision can never hand out the wrong block for the same parent.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

_ROOT_HASH = 0x6B76  # parent hash of the first block of every sequence


class BlockAllocationError(RuntimeError):
    """More blocks were requested than are free; callers check ``can_*`` first."""


def root_hash(namespace: int = 0) -> int:
    """The parent hash of a sequence's first block in prefix-cache ``namespace``: blocks
    hash apart per namespace, so a sequence only ever hits blocks computed in its own (0:
    the default path; 1: batch-invariant rows, engine/row_passes.py)."""
    return _ROOT_HASH if namespace == 0 else hash((_ROOT_HASH, namespace))


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    """The prefix-cache key of a full block: chained over (parent hash, token ids)."""
    return hash((parent_hash, tuple(token_ids)))


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    # the block's tokens, kept to verify a hit (None while the block is not cached)
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class BlockUsage:
    num_total_blocks: int
    num_used_blocks: int  # blocks with ref_count > 0
    num_cached_free_blocks: int  # free blocks that still hold a reusable cached prefix

    @property
    def fraction_used(self) -> float:
        return self.num_used_blocks / self.num_total_blocks


class BlockManager:
    """Hands out KV blocks to sequences, with ref counts and a prefix cache.

    Sequences are named by a hashable id. A sequence's block table is the list of its
    block ids in order; token ``i`` of the sequence lives in slot
    ``table[i // block_size] * block_size + i % block_size``.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 num_state_slots: int = 0):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) "
                             "must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching_off_reason = ""
        if enable_prefix_caching and num_state_slots:
            self.prefix_caching_off_reason = (
                "prefix caching is off: this model's linear-attention layers keep a state per "
                "sequence that cached KV blocks do not hold")
        self.enable_prefix_caching = enable_prefix_caching and not num_state_slots
        self.num_state_slots = num_state_slots
        self._free_states: list[int] = list(range(num_state_slots - 1, -1, -1))  # popped from the end
        self._state_of: dict[object, int] = {}
        self._blocks = [Block(i) for i in range(num_blocks)]
        # free block ids; popped from the front. Uncached blocks go to the front (reused
        # first), cached ones to the back, so eviction is least recently freed first.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._tables: dict[object, list[int]] = {}
        # per sequence: hashes of its leading full blocks that are registered (chain)
        self._seq_hashes: dict[object, list[int]] = {}
        self._seq_roots: dict[object, int] = {}  # per sequence: its namespace's root hash

    # ------------------------------------------------------------------ queries
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now, including evictable cached ones."""
        return len(self._free)

    def usage(self) -> BlockUsage:
        num_cached_free = sum(1 for b in self._free if self._blocks[b].block_hash is not None)
        return BlockUsage(self.num_blocks, self.num_blocks - len(self._free), num_cached_free)

    def block_table(self, seq_id: object) -> list[int]:
        return self._tables[seq_id]

    def has_blocks(self, seq_id: object) -> bool:
        return seq_id in self._tables

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, token_ids: Sequence[int], namespace: int = 0) -> list[int]:
        """Block ids of the longest cached prefix of ``token_ids`` (full blocks only) in
        prefix-cache ``namespace`` (``root_hash``).

        At most ``(len(token_ids) - 1) // block_size`` blocks: the last token is always
        left to compute, since its logits are needed. Changes nothing.
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (len(token_ids) - 1) // self.block_size
        hit: list[int] = []
        parent = root_hash(namespace)
        for i in range(max_blocks):
            tokens = tuple(token_ids[i * self.block_size:(i + 1) * self.block_size])
            parent = hash_block(parent, tokens)
            block_id = self._cached.get(parent)
            if block_id is None or self._blocks[block_id].token_ids != tokens:
                break
            hit.append(block_id)
        return hit

    def state_slot(self, seq_id: object) -> int:
        """The state slot of a sequence that has blocks (models with linear layers)."""
        return self._state_of[seq_id]

    @property
    def num_free_state_slots(self) -> int:
        return len(self._free_states)

    def can_allocate(self, num_tokens: int, cached_blocks: Sequence[int] = ()) -> bool:
        """Whether a new sequence of ``num_tokens`` slots (and a state slot, if the model
        keeps states) fits, reusing ``cached_blocks``."""
        if self.num_state_slots and not self._free_states:
            return False
        num_new = self.num_blocks_for(num_tokens) - len(cached_blocks)
        # cached blocks nobody uses sit in the free queue; taking them shrinks it
        num_reclaimed = sum(1 for b in cached_blocks if self._blocks[b].ref_count == 0)
        return num_new <= len(self._free) - num_reclaimed

    def can_append_slots(self, seq_id: object, num_tokens: int) -> bool:
        """Whether sequence ``seq_id`` can grow to ``num_tokens`` slots."""
        num_new = self.num_blocks_for(num_tokens) - len(self._tables[seq_id])
        return num_new <= len(self._free)

    # ------------------------------------------------------------------ mutations
    def allocate(self, seq_id: object, num_tokens: int, cached_blocks: Sequence[int] = (),
                 namespace: int = 0) -> list[int]:
        """Give a new sequence blocks for ``num_tokens`` slots; returns its block table.

        ``cached_blocks`` (from ``find_cached_prefix`` in the same ``namespace``) become its
        first blocks, shared; its full blocks are registered in ``namespace``.
        """
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        if not self.can_allocate(num_tokens, cached_blocks):
            raise BlockAllocationError(
                f"sequence {seq_id!r} needs {self.num_blocks_for(num_tokens)} blocks "
                f"({len(cached_blocks)} cached) but only {len(self._free)} are free")
        table = []
        for block_id in cached_blocks:
            self._take(block_id)
            table.append(block_id)
        self._seq_hashes[seq_id] = [self._blocks[b].block_hash for b in cached_blocks]
        self._seq_roots[seq_id] = root_hash(namespace)
        self._tables[seq_id] = table
        self._extend(table, num_tokens)
        if self.num_state_slots:
            self._state_of[seq_id] = self._free_states.pop()
        return table

    def append_slots(self, seq_id: object, num_tokens: int) -> list[int]:
        """Grow sequence ``seq_id`` to ``num_tokens`` slots; returns the new block ids."""
        table = self._tables[seq_id]
        if not self.can_append_slots(seq_id, num_tokens):
            raise BlockAllocationError(
                f"sequence {seq_id!r} needs {self.num_blocks_for(num_tokens) - len(table)} "
                f"more blocks but only {len(self._free)} are free")
        num_before = len(table)
        self._extend(table, num_tokens)
        return table[num_before:]

    def cache_full_blocks(self, seq_id: object, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Register the sequence's blocks that are now full of computed tokens.

        ``token_ids`` are the sequence's tokens (prompt + output), at least
        ``num_computed_tokens`` long. A block whose hash is already cached elsewhere
        (an identical prefix computed twice) simply stays uncached.
        """
        if not self.enable_prefix_caching:
            return
        hashes = self._seq_hashes[seq_id]
        table = self._tables[seq_id]
        bs = self.block_size
        for i in range(len(hashes), num_computed_tokens // bs):
            tokens = tuple(token_ids[i * bs:(i + 1) * bs])
            parent = hashes[-1] if hashes else self._seq_roots[seq_id]
            block_hash = hash_block(parent, tokens)
            hashes.append(block_hash)
            block = self._blocks[table[i]]
            if block.block_hash is None and block_hash not in self._cached:
                block.block_hash, block.token_ids = block_hash, tokens
                self._cached[block_hash] = block.block_id

    def trim(self, seq_id: object, num_tokens: int) -> None:
        """Give back the sequence's blocks past the first ``num_blocks_for(num_tokens)``
        (the slots of rejected speculative drafts). Those blocks are never hashed: only
        blocks full of computed tokens are, and they lie before ``num_tokens``."""
        table = self._tables[seq_id]
        num_kept = self.num_blocks_for(num_tokens)
        while len(table) > num_kept:
            block = self._blocks[table.pop()]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_id] = None
                if block.block_hash is None:
                    self._free.move_to_end(block.block_id, last=False)

    def free(self, seq_id: object) -> None:
        """Release a sequence's blocks. Cached ones stay hit-able until evicted."""
        table = self._tables.pop(seq_id)
        self._seq_hashes.pop(seq_id, None)
        self._seq_roots.pop(seq_id, None)
        if seq_id in self._state_of:
            self._free_states.append(self._state_of.pop(seq_id))
        # reversed: a sequence's last blocks are the least likely to be shared, so they
        # should be evicted before its first ones
        for block_id in reversed(table):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.block_hash is None:
                    self._free.move_to_end(block_id, last=False)

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash of free blocks (e.g. after a weights change)."""
        for block_id in self._free:
            self._uncache(self._blocks[block_id])

    # ------------------------------------------------------------------ helpers
    def _extend(self, table: list[int], num_tokens: int) -> None:
        for _ in range(self.num_blocks_for(num_tokens) - len(table)):
            block_id, _ = self._free.popitem(last=False)
            block = self._blocks[block_id]
            self._uncache(block)  # evict: it is about to hold other tokens
            block.ref_count = 1
            table.append(block_id)

    def _take(self, block_id: int) -> None:
        block = self._blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _uncache(self, block: Block) -> None:
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            block.block_hash = block.token_ids = None
