"""The cost model against independent counts: parameters, FLOPs, the real KV cache.

The stage table is only useful if its rows add up to what the model is: the parameters in
the GGUF file, the published parameter counts, the bytes the KV cache really allocates.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferpath.cache.kv import KVCache
from inferpath.config import ModelConfig
from inferpath.explain.cost import (
    LAYER_MATMUL_STAGES,
    STAGE_NAMES,
    Precision,
    attention_pairs,
    pass_cost,
)
from inferpath.explain.hardware import HARDWARE_PRESETS, get_hardware
from inferpath.explain.params import layer_params, weight_breakdown
from inferpath.explain.presets import MODEL_PRESETS, resolve_model_config
from inferpath.explain.request import RequestSpec, estimate_request

H100 = HARDWARE_PRESETS["h100-sxm"]
BF16 = Precision("bf16")


def smollm2_gguf() -> Path:
    from inferpath.models import resolve_model

    return resolve_model("smollm2-135m-instruct")


@pytest.mark.parametrize("name,published", [
    ("llama-3-8b", 8_030_261_248), ("llama-3-70b", 70_553_706_496),
    ("llama-3.1-405b", 405_853_388_800), ("mistral-7b", 7_241_732_096),
    ("mixtral-8x7b", 46_702_792_704), ("qwen2.5-0.5b", 494_032_768),
    ("smollm2-135m", 134_515_008),
])
def test_preset_parameter_counts_match_the_published_models(name, published):
    assert weight_breakdown(MODEL_PRESETS[name], 2).total_params == published


def test_mixtral_counts_total_and_active_parameters():
    w = weight_breakdown(MODEL_PRESETS["mixtral-8x7b"], 2)
    assert round(w.total_params / 1e9, 1) == 46.7
    assert round(w.active_params / 1e9, 1) == 12.9
    decode = pass_cost(MODEL_PRESETS["mixtral-8x7b"], H100, BF16, 1, 100)
    # one token touches 2 of 8 experts: a quarter of the expert weights is read
    expert_bytes = 3 * 32 * 8 * 4096 * 14336 * 2
    ffn_read = sum(decode.stage(n).weight_bytes for n in ("gate_proj", "up_proj", "down_proj"))
    assert ffn_read == pytest.approx(expert_bytes / 4)


def test_gguf_model_has_exactly_the_parameters_the_cost_model_counts():
    from inferpath.weights.gguf import config_from_gguf
    from inferpath.weights.gguf_index import read_gguf_index

    path = smollm2_gguf()
    index = read_gguf_index(path)
    config = config_from_gguf(index, path)  # what resolve_model_config(".gguf") returns
    in_file = sum(t.num_elements for t in index.tensors)
    assert weight_breakdown(config, 2).total_params == in_file
    preset = MODEL_PRESETS["smollm2-135m"]
    assert dataclasses.replace(config, name="", rms_norm_eps=0) == dataclasses.replace(preset, name="", rms_norm_eps=0)


def test_config_json_path_gives_the_same_shapes_as_the_preset(tmp_path):
    hf = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
          "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
          "num_key_value_heads": 8, "rope_theta": 500000.0, "max_position_embeddings": 8192,
          "rms_norm_eps": 1e-5}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    for spec in (tmp_path, tmp_path / "config.json"):
        config = resolve_model_config(str(spec))
        assert dataclasses.replace(config, name="") == dataclasses.replace(MODEL_PRESETS["llama-3-8b"], name="")


def _total_params_from_stages(config: ModelConfig, p) -> int:
    shared = config.vocab_size * config.hidden_size if config.tie_word_embeddings else 0
    return sum(s.params for s in p.stages) - shared


configs = st.builds(
    lambda kv, group, hd, h, inter, layers, vocab, bias, tie, experts, window: ModelConfig(
        architecture="mixtral" if experts else "qwen2" if bias else "llama",
        vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_layers=layers,
        num_heads=kv * group, num_kv_heads=kv, head_dim=hd, attention_bias=bias,
        tie_word_embeddings=tie, num_experts=experts, num_experts_per_tok=min(2, experts),
        sliding_window=window, max_position_embeddings=4096),
    st.integers(1, 4), st.integers(1, 4), st.sampled_from([16, 32, 64]), st.integers(8, 256),
    st.integers(8, 512), st.integers(1, 6), st.integers(10, 5000), st.booleans(), st.booleans(),
    st.sampled_from([0, 0, 4, 8]), st.sampled_from([None, None, 5]),
)


@settings(max_examples=60, deadline=None)
@given(config=configs, tokens=st.integers(1, 40), past=st.integers(0, 40), batch=st.integers(1, 4),
       dtype=st.sampled_from(["fp32", "bf16", "int8", "int4"]))
def test_stage_sums_equal_the_independent_totals(config, tokens, past, batch, dtype):
    precision = Precision(dtype)
    p = pass_cost(config, H100, precision, tokens, tokens + past, batch)
    n = tokens * batch
    layer = layer_params(config)
    # the stages hold every parameter of the model exactly once (tied head excepted)
    assert _total_params_from_stages(config, p) == weight_breakdown(config, 2).total_params
    # the layers' matmuls do 2 FLOPs per active parameter per token (+ bias adds, MoE combine)
    matmul_flops = sum(p.stage(s).flops for s in LAYER_MATMUL_STAGES if s in {x.name for x in p.stages})
    bias = (config.q_size + 2 * config.kv_size) if config.attention_bias else 0
    combine = 2 * config.num_experts_per_tok * config.hidden_size if config.is_moe else 0
    router_softmax = 5 * config.num_experts
    expected = 2 * (layer.active - layer.norms - bias) + bias + combine + (router_softmax if config.is_moe else 0)
    assert matmul_flops == pytest.approx(n * config.num_layers * expected)
    # the KV write stores exactly the seed's bytes per token for every new token
    assert p.stage("kv_write").bytes_written == n * config.kv_bytes_per_token(precision.kv_bytes)
    # time: each stage at its bound, the pass the sum of the stages
    assert p.time_s == pytest.approx(sum(max(s.flops / H100.flops_for(precision.compute_dtype),
                                             s.bytes_moved / H100.memory_bandwidth)
                                         for s in p.stages if s.on_accelerator))
    assert [s.name for s in p.stages] == [s for s in STAGE_NAMES if s in {x.name for x in p.stages}]


@given(tokens=st.integers(1, 30), past=st.integers(0, 30), window=st.one_of(st.none(), st.integers(1, 20)))
def test_attention_pairs_match_a_brute_force_causal_mask(tokens, past, window):
    context = tokens + past
    brute = sum(1 for q in range(past, context) for k in range(context)
                if k <= q and (window is None or q - k < window))
    assert attention_pairs(tokens, context, window) == brute


@pytest.mark.parametrize("dtype,torch_dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_kv_formula_agrees_with_the_real_cache_allocation(dtype, torch_dtype):
    config = MODEL_PRESETS["smollm2-135m"]
    spec = RequestSpec(config, H100, Precision(dtype), prompt_tokens=7, output_tokens=20)
    cost = estimate_request(spec, with_tables=False)
    cache = KVCache(config, num_blocks=spec.final_kv_tokens, block_size=1, dtype=torch_dtype)
    assert cache.num_bytes == cost.final_kv_bytes
    assert cache.bytes_per_token == cost.kv_bytes_per_token
    paged = KVCache(config, num_blocks=4, block_size=16, dtype=torch_dtype)
    assert paged.num_bytes == 64 * cost.kv_bytes_per_token


def test_request_totals_are_sums_over_its_passes():
    spec = RequestSpec(MODEL_PRESETS["llama-3-8b"], H100, BF16, prompt_tokens=50, output_tokens=30)
    cost = estimate_request(spec, with_tables=False)
    steps = [pass_cost(spec.config, H100, BF16, 1, 50 + i) for i in range(1, 31)]
    assert cost.num_passes == 31
    assert cost.decode.time_s == pytest.approx(sum(s.time_s for s in steps))
    assert cost.total_weight_traffic == pytest.approx(cost.prefill.weight_bytes + sum(s.weight_bytes for s in steps))
    assert cost.total_time_s == pytest.approx(cost.ttft_s + cost.decode.time_s)


def test_batching_shares_one_read_of_the_weights():
    cost = estimate_request(RequestSpec(MODEL_PRESETS["llama-3-70b"], H100, BF16))
    rows = {r["batch"]: r for r in cost.batch_table}
    assert rows[32]["step_time_s"] < 1.05 * rows[1]["step_time_s"]  # "almost the same wall-clock time"
    assert rows[32]["tokens_per_s_total"] > 30 * rows[1]["tokens_per_s_total"]
    assert rows[256]["intensity"] > 100 * rows[1]["intensity"]


def test_quantization_and_sharding_divide_the_decode_floor():
    spec = RequestSpec(MODEL_PRESETS["llama-3-8b"], H100, BF16, prompt_tokens=10, output_tokens=5)
    cost = estimate_request(spec)
    by_dtype = {r["dtype"]: r["step_time_s"] for r in cost.dtype_table}
    assert by_dtype["int4"] / by_dtype["bf16"] == pytest.approx(0.25, rel=0.02)
    by_devices = {r["devices"]: r["step_time_s"] for r in cost.device_table}
    assert by_devices[8] == pytest.approx(by_devices[1] / 8)
    sharded = estimate_request(dataclasses.replace(spec, devices=4), with_tables=False)
    assert sharded.decode_time_per_token_s == pytest.approx(by_devices[4], rel=0.01)


def test_fused_attention_keeps_flops_and_drops_the_score_traffic():
    config = MODEL_PRESETS["llama-3-8b"]
    plain = pass_cost(config, H100, BF16, 2000, 2000)
    fused = pass_cost(config, H100, BF16, 2000, 2000, fused_attention=True)
    assert fused.flops == plain.flops
    assert fused.stage("softmax").bytes_moved == 0 < plain.stage("softmax").bytes_moved
    assert fused.time_s < plain.time_s


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="8192"):
        RequestSpec(MODEL_PRESETS["llama-3-70b"], H100, BF16, prompt_tokens=8000, output_tokens=500)
    with pytest.raises(ValueError, match="h100-sxm"):
        get_hardware("tpu-v9")
    with pytest.raises(ValueError, match="fp8"):
        Precision.parse("fp8")
    with pytest.raises(ValueError, match="llama-3-70b"):
        resolve_model_config("no-such-model")


def test_hardware_presets_quote_their_source_and_the_h100_ridge():
    for spec in HARDWARE_PRESETS.values():
        assert "datasheet" in spec.source or "whitepaper" in spec.source
    assert get_hardware("h200").memory_bandwidth == 4.8e12
    assert H100.scaled(4).memory_bandwidth == 4 * H100.memory_bandwidth
    assert H100.scaled(4).ridge_point() == pytest.approx(H100.ridge_point())


@pytest.mark.parametrize("config", [
    ModelConfig(architecture="llama", vocab_size=96, hidden_size=64, intermediate_size=160,
                num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=64),
    ModelConfig(architecture="mixtral", vocab_size=96, hidden_size=64, intermediate_size=96,
                num_layers=2, num_heads=4, num_kv_heads=1, head_dim=16, num_experts=4,
                num_experts_per_tok=2, max_position_embeddings=64),
], ids=["dense", "moe"])
def test_matmul_flops_match_torch_flop_counter_on_the_real_model(config):
    """The cost model's matrix FLOPs against torch's own count of the model's matmuls.

    Prefill of 7 tokens then one decode step at context 8, on the real Transformer with
    random weights. torch counts every mm: projections, router, experts as routed, LM head.
    (It does not count the CPU attention kernel; attention pairs are checked by brute
    force in test_attention_pairs_match_a_brute_force_causal_mask.)
    """
    from torch.utils.flop_counter import FlopCounterMode

    from inferpath.model.metadata import one_sequence_metadata
    from inferpath.model import Transformer

    model = Transformer(config)
    model.init_random_weights(seed=0)
    assert sum(t.nbytes for t in model.parameters()) == weight_breakdown(config, 4).total_bytes
    cache = KVCache(config, num_blocks=1, block_size=16, dtype=torch.float32)
    ids = torch.arange(7) % config.vocab_size
    for tokens, start in ((ids, 0), (ids[:1], 7)):
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            hidden = model(tokens, torch.arange(start, start + len(tokens)), cache,
                           one_sequence_metadata(start, len(tokens), num_blocks=1))
            model.compute_logits(hidden[-1:])
        counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
        matmul = sum(n for op, n in counts.items() if op in ("aten.mm", "aten.addmm", "aten.bmm"))
        p = pass_cost(config, H100, Precision("fp32"), len(tokens), start + len(tokens))
        names = [n for n in (*LAYER_MATMUL_STAGES, "lm_head") if n in {s.name for s in p.stages}]
        # the model's FLOPs for gate/up/down are its experts' mms; the router's softmax and the
        # weighted combine of MoE outputs are elementwise, not mms
        extra = sum(p.stage(n).flops for n in names) - matmul
        if config.is_moe:
            n = len(tokens) * config.num_layers
            extra -= 5 * n * config.num_experts + 2 * n * config.num_experts_per_tok * config.hidden_size
        assert extra == 0, counts
