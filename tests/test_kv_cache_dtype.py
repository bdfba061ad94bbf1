"""A bfloat16 KV cache beside float32 activations (``EngineConfig.kv_cache_dtype``): half the
cache's bytes, K and V rounded to bf16 once as they are written. The attention kernels read
the cache widened exactly, so they compute what the float32 kernels compute over the
rounded values; the native decode step gives the module path's bits; the answers stay
within the rounding of K and V of the float32 cache's; what no path implements is refused
by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_decode_stack import generate

from inferpath.config import ConfigError, EngineConfig
from inferpath.engine.builder import build_kv_cache
from inferpath.engine.weight_plan import kv_cache_dtype
from inferpath.kernels import build
from inferpath.kernels import kernel_status
from inferpath.kernels.ops import run_paged_decode_attention, run_prefill_attention


def _paged_inputs(head_dim, kv_heads, group, lens, seed=0, block_size=16):
    gen = torch.Generator().manual_seed(seed)
    blocks = max(-(-n // block_size) for n in lens)
    num_blocks = blocks * len(lens) + 2
    tables = torch.randperm(num_blocks, generator=gen)[: blocks * len(lens)].view(len(lens), blocks).contiguous()
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).bfloat16()
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen).bfloat16()
    q = torch.randn(len(lens), kv_heads * group, head_dim, generator=gen) * 2
    return q, k, v, tables, torch.tensor(lens)


@pytest.mark.parametrize("isa", build.LEVEL_NAMES)
@pytest.mark.parametrize("head_dim,kv_heads,group", [(64, 3, 3), (128, 2, 6), (80, 2, 2), (32, 1, 16), (8, 2, 4)])
@torch.inference_mode()
def test_decode_attention_over_a_bf16_cache_is_the_float32_kernel_over_its_values(head_dim, kv_heads, group, isa,
                                                                                   monkeypatch):
    """float32 queries over a bf16 cache: the float32 kernel's bits over the cache widened
    (avx2, avx512: the same vector code, only the loads widen), and its values to float32
    rounding at the portable level (whose compiler may vectorise the two loops apart)."""
    if not build.can_run(isa):
        pytest.skip(f"this CPU cannot execute the {isa} level (its best is {build.cpu_level()})")
    mixed = build.native_paged_attention(torch.float32, isa, kv_dtype=torch.bfloat16)
    plain = build.native_paged_attention(torch.float32, isa)
    if mixed is None or plain is None:
        pytest.skip(kernel_status())
    q, k, v, tables, lens = _paged_inputs(head_dim, kv_heads, group, [300, 1, 77, 129])
    for threads in (1, 2):
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
        out = run_paged_decode_attention(mixed, q, k, v, tables, lens, head_dim ** -0.5, 0)
        widened = run_paged_decode_attention(plain, q, k.float(), v.float(), tables, lens, head_dim ** -0.5, 0)
        assert out.dtype == torch.float32
        if isa == "generic":
            torch.testing.assert_close(out, widened, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(out, widened)


@pytest.mark.parametrize("head_dim,kv_heads,group", [(64, 3, 3), (128, 2, 6), (80, 1, 4)])
@torch.inference_mode()
def test_prefill_attention_over_a_bf16_cache_is_the_float32_kernel_over_its_values(head_dim, kv_heads, group):
    """A prompt chunk over its cached context (the block table) and its own keys: the
    float32 prefill kernel's bits over the widened cache (the avx2, avxvnni and avx512 levels build it)."""
    mixed = build.native_prefill_attention(torch.float32, kv_dtype=torch.bfloat16)
    if mixed is None:
        pytest.skip(f"no native prefill attention at this level (built at avx2, avxvnni and avx512): {kernel_status()}")
    q, k, v, tables, _ = _paged_inputs(head_dim, kv_heads, group, [160], seed=1)
    chunk = torch.randn(40, kv_heads * group, head_dim, generator=torch.Generator().manual_seed(2))
    out = run_prefill_attention(mixed, chunk, k, v, head_dim ** -0.5, tables[0].contiguous(), 120)
    widened = run_prefill_attention(build.native_prefill_attention(torch.float32), chunk, k.float(), v.float(),
                                    head_dim ** -0.5, tables[0].contiguous(), 120)
    assert torch.equal(out, widened)


@pytest.mark.parametrize("isa", build.LEVEL_NAMES)
def test_a_bf16_cache_decodes_natively_to_the_module_paths_bits_and_near_the_float32_caches(isa, monkeypatch):
    """SmolLM2 Q4_1 with its cache in bf16 (chunked prompts: the second chunks read their
    context from the cache): the native step is taken and its tokens and logprobs are the
    module path's to the bit; against the float32 cache the tokens agree and the chosen
    tokens' logprobs move by K/V's rounding only."""
    if not build.can_run(isa):
        pytest.skip(f"this CPU cannot execute the {isa} level (its best is {build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", isa)
    if build.native_decode_layers() is None:
        pytest.skip(build.kernel_status())
    calls: list[bool] = []
    config = {"kv_cache_dtype": "bfloat16", "max_num_batched_tokens": 16}
    bf16 = generate("smollm2-135m-instruct", True, calls, **config)
    assert sum(calls) >= 20
    assert bf16 == generate("smollm2-135m-instruct", False, **config)
    f32 = generate("smollm2-135m-instruct", True, max_num_batched_tokens=16)
    tokens = [(a, b) for key in f32 for a, b in zip(bf16[key][0], f32[key][0])]
    assert sum(a == b for a, b in tokens) >= 0.9 * len(tokens)
    moved = [abs(x[1] - y[1]) for key in f32 for x, y in zip(bf16[key][1], f32[key][1]) if x[0] == y[0]]
    assert max(moved) < 0.1, max(moved)


def test_the_plan_and_the_cache_hold_bf16_kv_beside_float32_activations():
    from inferpath.engine.llm_engine import LLMEngine
    from inferpath.models import resolve_model

    engine = LLMEngine.from_model(resolve_model("smollm2-135m-instruct"),
                                  EngineConfig(threads=1, kv_cache_dtype="bfloat16", kv_cache_memory_bytes=2**24))
    plan = engine.weight_plan
    assert plan.activation_dtype == torch.float32 and plan.kv_dtype == torch.bfloat16
    assert "float32 activations, bfloat16 KV" in plan.describe()
    assert engine.kv_cache.dtype == torch.bfloat16
    assert engine.kv_cache.bytes_per_token == engine.model_config.kv_bytes_per_token(2)
    from inferpath.explain.precision import Precision

    assert Precision.of_plan(plan).kv_bytes == 2 and Precision.of_plan(plan).activation_bytes == 4


@pytest.mark.parametrize("value", ["fp8", "float16", "float32", "bf16"])
def test_a_kv_cache_dtype_no_path_implements_is_refused_by_name(value):
    with pytest.raises(ConfigError, match=f"kv_cache_dtype must be auto or bfloat16, got '{value}'"):
        EngineConfig(kv_cache_dtype=value)
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        EngineConfig(kv_cache_dtype="bfloat16", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="float16 activations is not implemented"):
        kv_cache_dtype("bfloat16", torch.float16)
    assert kv_cache_dtype("bfloat16", torch.bfloat16) == torch.bfloat16
    assert kv_cache_dtype("auto", torch.float32) == torch.float32


def test_latent_and_linear_attention_caches_refuse_a_kv_cache_dtype():
    """MLA's latent cache and Qwen3-Next's linear-attention states have paths of their own,
    which read the cache in the activations' dtype: a bf16 cache there is refused."""
    from inferpath.config import ModelConfig

    base = ModelConfig(architecture="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64)
    config = EngineConfig(kv_cache_dtype="bfloat16", num_kv_blocks=4)
    mla = dataclasses.replace(base, architecture="deepseek_v3", kv_lora_rank=16, qk_rope_head_dim=8,
                              qk_nope_head_dim=8, v_head_dim=8)
    with pytest.raises(ConfigError, match="not implemented for multi-head latent attention"):
        build_kv_cache(mla, config, torch.bfloat16)
    hybrid = dataclasses.replace(base, architecture="qwen3_next", layer_types=("linear_attention", "full_attention"),
                                 linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                                 linear_value_head_dim=8, linear_conv_kernel_dim=4)
    with pytest.raises(ConfigError, match="not implemented for linear-attention layers"):
        build_kv_cache(hybrid, config, torch.bfloat16)
    assert build_kv_cache(base, config, torch.bfloat16).dtype == torch.bfloat16


def test_a_prefix_cache_hit_over_a_bf16_cache_gives_the_cold_prompts_bits():
    """The cold prompt attends over its own K/V rows, rounded to bf16 in place; the warm one's
    tail reads the same values from the cache through the bf16 prefill kernel: the same
    tokens and logprobs to the bit (SmolLM2 Q4_1, whose x meets its weights in the same
    passes at every row count; where the native prefill attention is built)."""
    from test_repacked_gemm import greedy_twice_with_prefix_caching

    from inferpath.engine.llm_engine import LLMEngine
    from inferpath.models import resolve_model

    if build.native_prefill_attention(torch.float32, kv_dtype=torch.bfloat16) is None:
        pytest.skip(f"no native prefill attention at this level (built at avx2, avxvnni and avx512): {kernel_status()}")
    engine = LLMEngine.from_model(resolve_model("smollm2-135m-instruct"),
                                  EngineConfig(threads=2, kv_cache_dtype="bfloat16", kv_cache_memory_bytes=2**25))
    prompt = ("Write a Python function that parses a CSV file with a header row and returns a list of "
              "dictionaries, one per row, converting numeric fields to numbers. Explain each step.")
    cold, warm, computed = greedy_twice_with_prefix_caching(engine, prompt)
    assert 0 < computed < 16
    assert warm == cold
