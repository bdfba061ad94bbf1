"""Block manager: allocation, ref counts, the prefix hash chain and LRU eviction. No torch."""

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferpath.cache.blocks import BlockAllocationError, BlockManager, hash_block

BS = 4


def computed(bm: BlockManager, seq_id, tokens):
    """Allocate a sequence for all of ``tokens`` and mark them computed (cached)."""
    cached = bm.find_cached_prefix(tokens)
    bm.allocate(seq_id, len(tokens), cached)
    bm.cache_full_blocks(seq_id, tokens, len(tokens))
    return cached


def test_module_imports_no_torch():
    code = "import sys, inferpath.cache.blocks; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_allocate_append_free_counts():
    bm = BlockManager(num_blocks=8, block_size=BS)
    table = bm.allocate("a", 5)  # 5 tokens -> 2 blocks
    assert len(table) == 2 and bm.num_free_blocks == 6
    assert bm.append_slots("a", 8) == []  # still 2 blocks
    new = bm.append_slots("a", 9)
    assert len(new) == 1 and bm.block_table("a") == table and len(table) == 3
    assert bm.usage().num_used_blocks == 3
    bm.free("a")
    assert bm.num_free_blocks == 8 and not bm.has_blocks("a")


def test_cannot_allocate_more_than_free():
    bm = BlockManager(num_blocks=3, block_size=BS)
    assert bm.can_allocate(12) and not bm.can_allocate(13)
    with pytest.raises(BlockAllocationError, match="needs 4 blocks .* only 3 are free"):
        bm.allocate("a", 13)
    bm.allocate("a", 8)
    assert bm.can_append_slots("a", 12) and not bm.can_append_slots("a", 13)
    with pytest.raises(BlockAllocationError):
        bm.append_slots("a", 13)
    assert bm.num_free_blocks == 1  # the failed call changed nothing


def test_prefix_hit_is_chained_over_parent_hash():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = list(range(100, 112))  # 3 full blocks
    computed(bm, "a", a)
    table_a = bm.block_table("a")
    # same first two blocks, different third: two blocks hit
    assert bm.find_cached_prefix(a[:8] + [1, 2, 3, 4, 5]) == table_a[:2]
    # a different first block breaks the chain even though block 2 has equal tokens
    assert bm.find_cached_prefix([0, 0, 0, 0] + a[4:] + [9]) == []
    # differing in block 1 only: block 0 hits, nothing after
    assert bm.find_cached_prefix(a[:4] + [7, 7, 7, 7] + a[8:] + [9]) == table_a[:1]
    # the hash of block i depends on block i-1
    assert hash_block(hash_block(0, a[:4]), a[4:8]) != hash_block(hash_block(0, [1] * 4), a[4:8])


def test_last_token_is_never_a_hit():
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = list(range(8))
    computed(bm, "a", a)
    # an identical 8-token prompt reuses only block 0: its last token must be computed
    assert bm.find_cached_prefix(a) == bm.block_table("a")[:1]
    assert len(bm.find_cached_prefix(a + [8])) == 2


def test_shared_blocks_are_ref_counted():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = list(range(9))
    computed(bm, "a", a)
    cached = computed(bm, "b", a[:8] + [50, 51])
    assert cached == bm.block_table("a")[:2] and bm.block_table("b")[:2] == cached
    assert bm.usage().num_used_blocks == 3 + 1  # b adds one block of its own
    bm.free("a")
    assert bm.usage().num_used_blocks == 3  # the two shared blocks are still b's
    bm.free("b")
    assert bm.usage().num_used_blocks == 0 and bm.num_free_blocks == 8


def test_freed_cached_blocks_stay_hit_able_then_evict_lru():
    bm = BlockManager(num_blocks=6, block_size=BS)
    old, new = [1] * 8 + [0], [2] * 8 + [0]
    computed(bm, "old", old)
    computed(bm, "new", new)
    bm.free("old")
    bm.free("new")
    assert bm.usage().num_cached_free_blocks == 4
    assert len(bm.find_cached_prefix(old)) == 2 and len(bm.find_cached_prefix(new)) == 2
    # 3 blocks: the 2 uncached free blocks first, then the least recently freed cached
    # one. "old" was freed first, and a sequence's last block is evicted before its first.
    bm.allocate("x", 12)
    assert len(bm.find_cached_prefix(old)) == 1
    assert len(bm.find_cached_prefix(new)) == 2
    bm.allocate("y", 4)
    assert bm.find_cached_prefix(old) == [] and len(bm.find_cached_prefix(new)) == 2


def test_hit_on_free_block_takes_it_out_of_the_free_queue():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = list(range(9))
    computed(bm, "a", a)
    bm.free("a")
    cached = bm.find_cached_prefix(a)
    assert len(cached) == 2
    # 4 free blocks, but 2 of them are the hit: a 16-token sequence needs 2 more -> fits
    assert bm.can_allocate(16, cached) and not bm.can_allocate(20, cached)
    bm.allocate("b", 16, cached)
    assert bm.num_free_blocks == 0 and bm.block_table("b")[:2] == cached


def test_identical_blocks_computed_twice_register_once():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = list(range(5))
    bm.allocate("a", 5)
    bm.allocate("b", 5)  # both miss: scheduled in the same step
    bm.cache_full_blocks("a", a, 5)
    bm.cache_full_blocks("b", a, 5)
    assert bm.find_cached_prefix(a) == bm.block_table("a")[:1]
    bm.free("a")
    bm.free("b")
    assert bm.usage().num_cached_free_blocks == 1


def test_disabled_prefix_caching_never_hits():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = list(range(9))
    computed(bm, "a", a)
    assert bm.find_cached_prefix(a) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "grow", "free"]), st.integers(0, 5),
                          st.integers(1, 20), st.integers(0, 2)), max_size=40))
def test_random_operations_keep_ref_counts_consistent(ops):
    bm = BlockManager(num_blocks=10, block_size=BS)
    tokens: dict[int, list[int]] = {}
    for op, seq, n, vocab in ops:
        if op == "alloc" and seq not in tokens:
            toks = [vocab] * n  # few distinct contents, so prefixes are shared often
            cached = bm.find_cached_prefix(toks)
            if bm.can_allocate(n, cached):
                bm.allocate(seq, n, cached)
                bm.cache_full_blocks(seq, toks, n)
                tokens[seq] = toks
        elif op == "grow" and seq in tokens:
            toks = tokens[seq] + [vocab] * n
            if bm.can_append_slots(seq, len(toks)):
                bm.append_slots(seq, len(toks))
                bm.cache_full_blocks(seq, toks, len(toks))
                tokens[seq] = toks
        elif op == "free" and seq in tokens:
            bm.free(seq)
            del tokens[seq]
        refs: dict[int, int] = {}
        for seq_id, toks in tokens.items():
            table = bm.block_table(seq_id)
            assert len(table) == bm.num_blocks_for(len(toks))
            for block_id in table:
                refs[block_id] = refs.get(block_id, 0) + 1
        assert bm.usage().num_used_blocks == len(refs)
        assert bm.num_free_blocks + len(refs) == bm.num_blocks
        for block_id, count in refs.items():
            assert bm._blocks[block_id].ref_count == count
