"""KVCache: shapes, the seed's bytes-per-token formula, real allocation, budget sizing."""

from __future__ import annotations

import pytest
import torch

from inferpath.cache.kv import KVCache
from inferpath.config import ModelConfig
from inferpath.model.attention import KVWrite

LLAMA3_70B = ModelConfig(architecture="llama", vocab_size=128_256, hidden_size=8192, intermediate_size=28_672,
                         num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128)
SMOLLM2 = ModelConfig(architecture="llama", vocab_size=49_152, hidden_size=576, intermediate_size=1536,
                      num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, tie_word_embeddings=True)


@pytest.mark.parametrize("dtype, dtype_bytes", [(torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2)])
@pytest.mark.parametrize("config", [LLAMA3_70B, SMOLLM2], ids=["llama3-70b", "smollm2"])
def test_bytes_per_token_is_the_seeds_formula(config, dtype, dtype_bytes):
    cache = KVCache(config, num_blocks=2, block_size=4, dtype=dtype)
    formula = 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes
    assert cache.bytes_per_token == formula
    real = sum(t.numel() * t.element_size() for t in cache.k_caches + cache.v_caches)
    assert cache.num_bytes == real == formula * 4 * 2


def test_seed_numbers_for_llama3_70b():
    # The seed: 327,680 bytes per token in bf16; a 7-token prompt occupies 2.3 MB.
    cache = KVCache(LLAMA3_70B, num_blocks=1, block_size=7, dtype=torch.bfloat16)
    assert cache.bytes_per_token == 327_680
    assert cache.num_bytes == 2_293_760


def test_shapes_dtype_and_zero_fill():
    cache = KVCache(SMOLLM2, num_blocks=5, block_size=16, dtype=torch.bfloat16)
    assert len(cache.k_caches) == len(cache.v_caches) == 30
    for t in cache.k_caches + cache.v_caches:
        assert t.shape == (5, 16, 3, 64) and t.dtype == torch.bfloat16
        assert not t.any()
    assert len({t.data_ptr() for t in cache.k_caches + cache.v_caches}) == 60


def test_write_by_slot_read_by_block_table():
    cache = KVCache(SMOLLM2, num_blocks=6, block_size=4)
    blocks = [5, 2, 0]  # a sequence of 10 tokens in non-contiguous blocks
    slots = torch.tensor([blocks[p // 4] * 4 + p % 4 for p in range(10)])
    k = torch.randn(10, 3, 64)
    v = torch.randn(10, 3, 64)
    KVWrite()(k, v, cache.k_caches[7], cache.v_caches[7], slots)
    read_k = cache.k_caches[7][torch.tensor(blocks)].reshape(-1, 3, 64)[:10]
    read_v = cache.v_caches[7][torch.tensor(blocks)].reshape(-1, 3, 64)[:10]
    assert torch.equal(read_k, k) and torch.equal(read_v, v)
    assert not cache.k_caches[6].any()  # other layers untouched


def test_num_blocks_for_budget():
    per_block = SMOLLM2.kv_bytes_per_token(4) * 16  # 737,280 bytes
    assert KVCache.num_blocks_for_budget(SMOLLM2, 16, torch.float32, 10 * per_block) == 10
    assert KVCache.num_blocks_for_budget(SMOLLM2, 16, torch.float32, 11 * per_block - 1) == 10
    assert KVCache.num_blocks_for_budget(SMOLLM2, 16, torch.bfloat16, 10 * per_block) == 20
    with pytest.raises(ValueError, match=r"1000 bytes.*737280 bytes"):
        KVCache.num_blocks_for_budget(SMOLLM2, 16, torch.float32, 1000)


def test_rejects_empty_cache():
    with pytest.raises(ValueError, match="num_blocks"):
        KVCache(SMOLLM2, num_blocks=0, block_size=16)
