"""Tensor parallelism: N gloo ranks on this CPU give the logits of the unsharded model."""

from __future__ import annotations

import pytest
import torch

from inferpath.cache.kv import KVCache
from inferpath.config import ModelConfig
from inferpath.model import Transformer
from inferpath.model.metadata import AttentionMetadata
from inferpath.parallel import apply_tensor_parallel, check_shardable, run_parallel, shard_config

BLOCK_SIZE = 4
PROMPT = [3, 17, 101, 7, 64, 9, 250]
NUM_DECODE_STEPS = 3

CONFIGS = {
    "llama-tied": ModelConfig("llama", vocab_size=256, hidden_size=64, intermediate_size=96, num_layers=2,
                              num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True),
    "qwen2-bias-odd-vocab": ModelConfig("qwen2", vocab_size=255, hidden_size=64, intermediate_size=96,
                                        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                                        attention_bias=True),
    "mixtral": ModelConfig("mixtral", vocab_size=256, hidden_size=64, intermediate_size=64, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2),
}


def _one_sequence_meta(start: int, num_new: int) -> AttentionMetadata:
    """Metadata for one sequence laid out in blocks 0, 1, 2, ... (contiguous slots)."""
    seq_len = start + num_new
    num_blocks = -(-seq_len // BLOCK_SIZE)
    return AttentionMetadata(
        slot_mapping=torch.arange(start, seq_len), query_start_loc=torch.tensor([0, num_new]),
        seq_lens=torch.tensor([seq_len]), block_tables=torch.arange(num_blocks)[None, :],
        query_lens=[num_new], seq_lens_list=[seq_len], block_size=BLOCK_SIZE,
    )


@torch.inference_mode()
def greedy_logits(model: Transformer, cache_config: ModelConfig) -> torch.Tensor:
    """Prefill PROMPT, then NUM_DECODE_STEPS greedy steps; logits of every step stacked."""
    cache = KVCache(cache_config, num_blocks=8, block_size=BLOCK_SIZE)
    tokens = list(PROMPT)
    new = tokens
    all_logits = []
    for _ in range(NUM_DECODE_STEPS + 1):
        start = len(tokens) - len(new)
        meta = _one_sequence_meta(start, len(new))
        hidden = model(torch.tensor(new), torch.arange(start, len(tokens)), cache, meta)
        logits = model.compute_logits(hidden[-1:])  # (1, vocab)
        all_logits.append(logits[0])
        new = [int(logits.argmax())]
        tokens = tokens + new
    return torch.stack(all_logits)


def _build(config: ModelConfig) -> Transformer:
    model = Transformer(config)
    model.init_random_weights(seed=1, std=0.1)
    return model.eval()


def _sharded_rank(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """Every case on this rank (one spawn for all: starting ranks is the slow part)."""
    results = {}
    for case, config in CONFIGS.items():
        model = apply_tensor_parallel(_build(config), rank, world_size)
        results[case] = greedy_logits(model, shard_config(config, world_size))
    return results


@pytest.fixture(scope="module")
def two_rank_logits() -> dict[str, torch.Tensor]:
    return run_parallel(_sharded_rank, 2)


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_two_ranks_match_one_device(case, two_rank_logits):
    config = CONFIGS[case]
    expected = greedy_logits(_build(config), config)
    actual = two_rank_logits[case]
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_sharded_shapes_and_kv_cache_are_split():
    config = CONFIGS["llama-tied"]
    per_rank = shard_config(config, 2)
    assert (per_rank.num_heads, per_rank.num_kv_heads, per_rank.intermediate_size) == (2, 1, 48)
    # each rank caches half the KV heads: the cache per token halves
    assert per_rank.kv_bytes_per_token(4) * 2 == config.kv_bytes_per_token(4)


def test_unshardable_size_names_the_dimension():
    with pytest.raises(ValueError, match="num_kv_heads"):
        check_shardable(CONFIGS["llama-tied"], 4)


def test_engine_with_three_ranks_gives_the_same_tokens_on_smollm2():
    """LLM(tensor_parallel_size=3): SmolLM2's 9/3 heads, FFN 1,536 and vocab 49,152 split three
    ways; each rank caches one KV head; greedy tokens equal the single-process engine's."""
    from inferpath import LLM, SamplingParams

    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = ["What is a quadratic equation?", "The capital of France is"]
    # float32 both: by default (dtype auto) the single process runs the Q4_1 file quantized
    sharded = LLM("smollm2-135m-instruct", tensor_parallel_size=3, kv_cache_memory_bytes=32 * 1024**2,
                  dtype="float32")
    single = LLM("smollm2-135m-instruct", kv_cache_memory_bytes=32 * 1024**2, dtype="float32")
    assert sharded.engine.kv_cache.bytes_per_token * 3 == single.engine.kv_cache.bytes_per_token
    plan = sharded.engine.weight_plan  # rank 0's; the workers load and cache by it too
    assert plan.tensor_parallel_size == 3 and plan.matrices == "dequantized" and not plan.keep_quantized
    assert sharded.engine.kv_cache.k_caches[0].dtype == plan.kv_dtype == torch.float32
    expected = [out.outputs[0].token_ids for out in single.generate(prompts, params)]
    assert [out.outputs[0].token_ids for out in sharded.generate(prompts, params)] == expected
    sharded.engine.runner.model.close()
