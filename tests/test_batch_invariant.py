"""Batch-invariant mode: one request's token ids and logprobs are bitwise the same alone,
in batches of 2, 8 and 32 with longer and shorter prompts, after a prefix-cache hit and
after a forced preemption; fp32 and bf16; native kernels on and off.

The model is a small random Llama (2 layers, head_dim 32, SmolLM2's 49,152-token vocab so
the real tokenizer detokenizes its output); its weights are scaled up so that the greedy
choice is not a near tie. The reference is the request run alone in a fresh engine.
"""

from __future__ import annotations

import random

import pytest
import torch

from inferpath.config import EngineConfig, ModelConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.kernels import accelerate
from inferpath.model import Transformer
from inferpath.model.batch_invariant import make_batch_invariant
from inferpath.models import resolve_model
from inferpath.sampling.params import SamplingParams
from inferpath.tokenizer import load_tokenizer

CONFIG = ModelConfig(architecture="llama", vocab_size=49_152, hidden_size=128, intermediate_size=256,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=512)
PARAMS = SamplingParams(max_tokens=6, temperature=0, logprobs=0)
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("smollm2-135m-instruct"))


def build(dtype: str, cpu_kernels: bool) -> Transformer:
    model = Transformer(CONFIG, dtype=getattr(torch, dtype))
    model.init_random_weights(seed=0, std=0.08)
    if cpu_kernels:
        accelerate(model)
    return make_batch_invariant(model).eval()


def engine(model, tokenizer, dtype: str, **overrides) -> LLMEngine:
    config = dict(dtype=dtype, block_size=BLOCK_SIZE, num_kv_blocks=512, batch_invariant=True) | overrides
    return LLMEngine(model, tokenizer, CONFIG, EngineConfig(**config), eos_token_ids=[])


def run(engine: LLMEngine, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    """(token ids, chosen-token logprobs) of each prompt, all submitted at once."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, PARAMS)
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0]
    return [(c.token_ids, [lp.logprob for lp in c.logprobs]) for c in (finished[f"r{i}"] for i in range(len(prompts)))]


def random_prompts(count: int, seed: int, lengths=(1, 40)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 40_000) for _ in range(rng.randint(*lengths))] for _ in range(count)]


TARGET = random_prompts(1, seed=99, lengths=(13, 13))[0]


@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_request_is_bitwise_the_same_in_any_company(tokenizer, dtype, cpu_kernels):
    model = build(dtype, cpu_kernels)
    alone = run(engine(model, tokenizer, dtype), [TARGET])[0]
    assert len(alone[0]) == PARAMS.max_tokens

    for batch_size in (2, 8, 32):  # others longer and shorter, the target in the middle
        shorter = random_prompts((batch_size - 1) // 2, seed=batch_size, lengths=(1, 12))
        longer = random_prompts(batch_size // 2, seed=-batch_size, lengths=(14, 40))
        prompts = shorter + [TARGET] + longer
        results = run(engine(model, tokenizer, dtype), prompts)
        assert results[len(shorter)] == alone, f"batch of {batch_size}"

    cached = engine(model, tokenizer, dtype)  # a prefix hit: 8 of the 13 tokens cached
    run(cached, [TARGET[:9] + [7]])
    hits = cached.stats().prefix_cache_hits
    assert run(cached, [TARGET])[0] == alone
    assert cached.stats().prefix_cache_hits - hits == 8

    small = engine(model, tokenizer, dtype, num_kv_blocks=12)  # 48 slots for 4 sequences
    results = run(small, [TARGET] + random_prompts(3, seed=5, lengths=(8, 12)))
    assert small.stats().num_preemptions > 0
    assert results[0] == alone

    chunked = engine(model, tokenizer, dtype, max_num_batched_tokens=5)  # prompt in 3 chunks
    assert run(chunked, [TARGET])[0] == alone


def test_batch_invariant_refuses_tensor_parallelism():
    with pytest.raises(ValueError, match="batch_invariant"):
        EngineConfig(batch_invariant=True, tensor_parallel_size=2)


def test_quantized_gguf_request_is_bitwise_the_same_in_any_company():
    """The default model as it runs by default (Q4_1 + Q8_0 blocks read in place): prompt
    rows past the fused kernel's row count (40-token prompts) and decode rows alike."""
    from inferpath import LLM

    llm = LLM("smollm2-135m-instruct", batch_invariant=True, max_num_seqs=16)
    assert "Q4_1" in str(llm.engine.weight_format)
    prompts = random_prompts(7, seed=5, lengths=(33, 60))

    def run_llm(batch):
        outs = llm.generate(batch, PARAMS)
        return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outs]

    alone = run_llm([TARGET])[0]
    crowded = run_llm(prompts[:3] + [TARGET] + prompts[3:])[3]
    assert crowded[0] == alone[0]
    assert torch.equal(torch.tensor(crowded[1]), torch.tensor(alone[1]))
