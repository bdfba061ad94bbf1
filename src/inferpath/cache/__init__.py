"""The KV cache: ``blocks`` (which blocks each sequence owns; ref counts and prefix hashes;
no torch) and ``kv`` (the K/V tensors, written by slot and read by block table)."""

from inferpath.cache.blocks import BlockAllocationError, BlockManager, BlockUsage

__all__ = ["BlockAllocationError", "BlockManager", "BlockUsage"]
