"""The cost model for latent attention (DeepSeek-V3) and hybrid linear attention (Qwen3-Next).

Against independent counts: the per-token cache and per-sequence state of the real
configurations computed by hand, the published parameter totals, the parameters of tiny
transformers models built from the same configs, and the stage table's own sums.
"""

from __future__ import annotations

import dataclasses

import pytest
import transformers  # test-only reference
from hypothesis import given, settings
from hypothesis import strategies as st

from inferpath.cli import main
from inferpath.config import ConfigError, ModelConfig, require_engine_support
from inferpath.config_kinds import layer_kinds
from inferpath.explain.cost import Precision, pass_cost
from inferpath.explain.hardware import HARDWARE_PRESETS
from inferpath.explain.layer_cost import STAGE_ORDER
from inferpath.explain.params import weight_breakdown
from inferpath.explain.presets import MODEL_PRESETS
from inferpath.explain.roofline import roofline_points

H100 = HARDWARE_PRESETS["h100-sxm"]
BF16 = Precision("bf16")
DSV3, QNEXT = MODEL_PRESETS["deepseek-v3"], MODEL_PRESETS["qwen3-next-80b-a3b"]

# The published config.json files' dimensions (deepseek-ai/DeepSeek-V3,
# Qwen/Qwen3-Next-80B-A3B-Instruct), as transformers 5.24 reads them
DSV3_JSON = dict(vocab_size=129_280, hidden_size=7168, intermediate_size=18_432, moe_intermediate_size=2048,
                 num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
                 n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536,
                 qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4,
                 num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True, rms_norm_eps=1e-6)
QNEXT_JSON = dict(vocab_size=151_936, hidden_size=2048, intermediate_size=5120, num_hidden_layers=48,
                  num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_conv_kernel_dim=4,
                  linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                  linear_num_value_heads=32, decoder_sparse_step=1, moe_intermediate_size=512,
                  shared_expert_intermediate_size=512, num_experts_per_tok=10, num_experts=512,
                  norm_topk_prob=True, mlp_only_layers=[], rms_norm_eps=1e-6)
SHAPES = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_experts",
          "num_experts_per_tok", "moe_intermediate_size", "dense_layers", "layer_types",
          *(f.name for f in dataclasses.fields(ModelConfig)
            if f.name.startswith(("linear_", "qk_", "kv_", "q_lora", "v_head", "n_group", "topk_group"))),
          "num_shared_experts", "shared_expert_intermediate_size", "router_scoring", "router_correction_bias",
          "routed_scaling_factor", "attn_output_gate", "partial_rotary_factor", "qk_norm")


def test_presets_have_the_shapes_transformers_reads_from_the_published_configs():
    for preset, cfg in ((DSV3, transformers.DeepseekV3Config(**DSV3_JSON)),
                        (QNEXT, transformers.Qwen3NextConfig(**QNEXT_JSON))):
        read = ModelConfig.from_hf_config(cfg.to_dict())
        assert {f: getattr(read, f) for f in SHAPES} == {f: getattr(preset, f) for f in SHAPES}


def test_deepseek_v3_latent_cache_per_token_by_hand():
    # 61 layers x (512 latent + 64 RoPE key) values; bf16 = 70,272 B (~70 KB) a token
    assert DSV3.kv_bytes_per_token(2) == 61 * (512 + 64) * 2 == 70_272
    assert DSV3.kv_bytes_per_token(4) == 140_544
    assert DSV3.state_bytes_per_sequence(2) == 0
    # plain multi-head attention over the same heads would cache 61 x 128 x (192 + 128) x 2 B
    assert 61 * 128 * (192 + 128) * 2 / DSV3.kv_bytes_per_token(2) == pytest.approx(71.1, abs=0.05)


def test_qwen3_next_cache_and_state_by_hand():
    # K and V on the 12 full-attention layers only: 2 x 12 x 2 KV heads x 256 x 2 B
    assert QNEXT.num_attention_layers == 12 and QNEXT.num_linear_layers == 36
    assert QNEXT.kv_bytes_per_token(2) == 2 * 12 * 2 * 256 * 2 == 24_576
    # each of 36 linear layers: conv inputs (2 x 16 x 128 + 32 x 128 = 8,192 channels x 3)
    # + the delta rule's 32 value heads x 128 x 128 matrix = 548,864 values
    assert QNEXT.state_bytes_per_sequence(2) == 36 * (8192 * 3 + 32 * 128 * 128) * 2 == 39_518_208


def test_published_parameter_totals():
    w = weight_breakdown(DSV3, 2)
    assert w.total_params == 671_026_419_200  # "671B total" (DeepSeek-V3's report, MTP module apart)
    # "37B activated": 36.6B without the embedding table (the convention here counts it whole)
    assert round((w.active_params - DSV3.vocab_size * DSV3.hidden_size) / 1e9, 1) == 36.6
    assert [(n, c) for n, c, _ in w.layer_groups] == [("MLA + dense FFN", 3), ("MLA + MoE", 58)]
    q = weight_breakdown(QNEXT, 2)
    assert (q.total_params, q.active_params) == (79_674_391_296, 3_874_929_408)  # "80B, 3B active"


def _tiny_deepseek(**kw) -> transformers.DeepseekV3Config:
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
                num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1, kv_lora_rank=16,
                q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, max_position_embeddings=128)
    return transformers.DeepseekV3Config(**(base | kw))


def _tiny_qwen3_next(**kw) -> transformers.Qwen3NextConfig:
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=8, linear_value_head_dim=6, linear_conv_kernel_dim=4, num_experts=8,
                num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=20,
                mlp_only_layers=[1], max_position_embeddings=128)
    return transformers.Qwen3NextConfig(**(base | kw))


@pytest.mark.parametrize("hf_config", [
    _tiny_deepseek(), _tiny_deepseek(q_lora_rank=None, n_shared_experts=2, first_k_dense_replace=0),
    _tiny_qwen3_next(), _tiny_qwen3_next(tie_word_embeddings=True),
    transformers.Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=16, shared_expert_intermediate_size=24, mlp_only_layers=[1]),
], ids=["deepseek_v3", "deepseek_v3 full-rank q", "qwen3_next", "qwen3_next tied", "qwen2_moe dense layer"])
def test_parameters_equal_a_transformers_model_built_from_the_same_config(hf_config):
    model = transformers.AutoModelForCausalLM.from_config(hf_config)
    in_model = sum(t.numel() for t in model.state_dict().values())  # + DeepSeek's correction bias buffer
    if hf_config.tie_word_embeddings:
        in_model -= hf_config.vocab_size * hf_config.hidden_size
    config = ModelConfig.from_hf_config(hf_config.to_dict())
    assert weight_breakdown(config, 2).total_params == in_model
    for tokens, past in ((5, 0), (1, 9)):  # expanded and absorbed MLA hold the same weights
        p = pass_cost(config, H100, BF16, tokens, tokens + past)
        shared = config.vocab_size * config.hidden_size if config.tie_word_embeddings else 0
        assert sum(s.params for s in p.stages) - shared == in_model


kind_configs = st.builds(
    lambda mla, layers, heads, qr, tie, experts, dense, shared, linear_every: ModelConfig(
        architecture="deepseek_v3" if mla else "qwen3_next", vocab_size=50, hidden_size=24, intermediate_size=40,
        num_layers=layers, num_heads=heads, num_kv_heads=heads if mla else 1, head_dim=12,
        num_experts=experts, num_experts_per_tok=min(2, experts), moe_intermediate_size=8,
        dense_layers=tuple(range(min(dense, layers))) if experts else (), tie_word_embeddings=tie,
        kv_lora_rank=16 if mla else 0, q_lora_rank=qr if mla else 0, qk_nope_head_dim=8 if mla else 0,
        qk_rope_head_dim=4 if mla else 0, v_head_dim=6 if mla else 0,
        num_shared_experts=shared if mla and experts else 0,
        shared_expert_intermediate_size=0 if mla or not experts else 8 * shared,
        layer_types=None if mla else tuple("full_attention" if (i + 1) % linear_every == 0 else "linear_attention"
                                           for i in range(layers)),
        attn_output_gate=not mla, qk_norm="" if mla else "head", partial_rotary_factor=1.0 if mla else 0.5,
        linear_num_key_heads=0 if mla else 2, linear_num_value_heads=0 if mla else 4,
        linear_key_head_dim=0 if mla else 8, linear_value_head_dim=0 if mla else 6,
        linear_conv_kernel_dim=0 if mla else 4, max_position_embeddings=4096),
    st.booleans(), st.integers(1, 6), st.integers(1, 4), st.sampled_from([0, 12]), st.booleans(),
    st.sampled_from([0, 4, 8]), st.integers(0, 3), st.integers(0, 2), st.integers(1, 4),
)


@settings(max_examples=60, deadline=None)
@given(config=kind_configs, tokens=st.integers(1, 40), past=st.integers(0, 40), batch=st.integers(1, 4),
       dtype=st.sampled_from(["fp32", "bf16", "int8"]), fused=st.booleans())
def test_stage_totals_are_sums_and_hold_every_parameter_once(config, tokens, past, batch, dtype, fused):
    precision = Precision(dtype)
    p = pass_cost(config, H100, precision, tokens, tokens + past, batch, fused)
    for total in ("flops", "bytes_read", "bytes_written", "weight_bytes", "time_s"):
        assert getattr(p, total) == pytest.approx(sum(getattr(s, total) for s in p.stages))
    shared = config.vocab_size * config.hidden_size if config.tie_word_embeddings else 0
    assert sum(s.params for s in p.stages) - shared == weight_breakdown(config, 2).total_params
    # per-layer stages count the layers that have them; the norms are in every layer
    assert p.stage("rmsnorm_attn").count == p.stage("residual_ffn").count == config.num_layers
    names = {s.name for s in p.stages}
    assert (p.stage("gdn_recurrence").count if "gdn_recurrence" in names else 0) == config.num_linear_layers
    assert (p.stage("attn_scores").count if "attn_scores" in names else 0) == config.num_attention_layers
    if config.is_mla:  # absorbed for a decode step, expanded for several tokens
        assert p.stage("q_absorb" if tokens == 1 else "kv_b_proj").count == config.num_layers
    moe_layers = sum(n for k, n in layer_kinds(config) if k.ffn == "moe")
    assert (p.stage("router").count if "router" in names else 0) == moe_layers
    # the cache write stores exactly kv_bytes_per_token for every new token
    written = p.stage("kv_write").bytes_written if "kv_write" in names else 0  # none if every layer is linear
    assert written == tokens * batch * config.kv_bytes_per_token(precision.kv_bytes)
    # each stage at its bound; stages in pipeline order
    peak = H100.flops_for(precision.compute_dtype)
    assert p.time_s == pytest.approx(sum(max(s.flops / peak, s.bytes_moved / H100.memory_bandwidth)
                                         for s in p.stages if s.on_accelerator))
    assert [s.name for s in p.stages] == [n for n in STAGE_ORDER if n in {s.name for s in p.stages}]


def test_decode_reads_the_active_parameters_once():
    """At batch 1 a decode step touches k experts a layer: its weight bytes are the active
    parameters (one embedding row, not the table) at 2 bytes."""
    for config in (DSV3, QNEXT):
        d = pass_cost(config, H100, BF16, 1, 100)
        active = weight_breakdown(config, 2).active_params
        one_row = active - config.vocab_size * config.hidden_size + config.hidden_size
        assert d.weight_bytes == pytest.approx(2 * one_row, rel=1e-12)
    # the figure explain prints for DeepSeek-V3: 36.6B active parameters, 73.25 GB a token in bf16
    assert pass_cost(DSV3, H100, BF16, 1, 8).weight_bytes / 1e9 == pytest.approx(73.25, abs=0.005)


def test_absorbed_decode_reads_each_latent_once_for_all_heads():
    L, r, p, heads = 61, 512, 64, 128
    a, b = (pass_cost(DSV3, H100, BF16, 1, c, batch=3) for c in (1000, 1001))
    # one more context token: its 576 cached values read once by the scores and its 512 latent
    # values once by the weighted sum, for every layer and sequence, whatever the 128 heads
    assert b.stage("attn_scores").bytes_read - a.stage("attn_scores").bytes_read == 3 * L * (r + p) * 2
    assert (b.stage("attn_weighted_sum").bytes_read - a.stage("attn_weighted_sum").bytes_read
            == 3 * L * r * 2 + 3 * L * heads * 4)  # + the scores of that token, fp32
    # the expanded form (a prefill chunk) up-projects every cached latent to 128 heads' K and V
    chunk = pass_cost(DSV3, H100, BF16, 16, 1016)
    assert chunk.stage("kv_b_proj").bytes_written == L * 1016 * heads * (128 + 128) * 2
    assert "kv_b_proj" not in {s.name for s in a.stages} and "q_absorb" not in {s.name for s in chunk.stages}


def test_hybrid_decode_grows_with_context_only_on_attention_layers():
    short, long = (pass_cost(QNEXT, H100, BF16, 1, c) for c in (100, 100_000))
    for name in ("gdn_conv", "gdn_recurrence", "gdn_in_proj"):
        assert short.stage(name).bytes_moved == long.stage(name).bytes_moved
    # the recurrence reads and writes the 36 layers' delta-rule state once a step
    assert short.stage("gdn_recurrence").bytes_read >= 36 * 32 * 128 * 128 * 2
    extra = long.stage("attn_scores").bytes_read - short.stage("attn_scores").bytes_read
    assert extra == 12 * (100_000 - 100) * 2 * 256 * 2  # K of the 12 attention layers


def test_roofline_places_the_new_stages_under_the_roof():
    for config, stages in ((DSV3, {"q_absorb": "layer matmuls", "kv_b_proj": "layer matmuls",
                                   "attn_scores": "attention", "shared_up_proj": "layer matmuls"}),
                           (QNEXT, {"gdn_recurrence": "attention", "gdn_in_proj": "layer matmuls",
                                    "gdn_conv": "elementwise"})):
        points = roofline_points(config, H100, BF16)
        groups = {p["stage"]: p["group"] for p in points}
        assert {s: groups[s] for s in stages} == stages
        peak, bw = H100.flops_for("bf16"), H100.memory_bandwidth
        for point in points:
            assert point["flops_per_s"] <= min(peak, bw * point["intensity"]) * (1 + 1e-9)


def test_explain_prints_the_latent_cache_and_the_active_weights(capsys):
    assert main(["explain", "--model", "deepseek-v3"]) == 0
    out = capsys.readouterr().out
    assert "KV cache: 70,272 B per token" in out
    assert "61 layers x (512 latent + 64 RoPE values)" in out
    assert "decode is memory-bound: 73.25 GB of weights read per token" in out
    assert "3 x MLA + dense FFN" in out and "58 x MLA + MoE" in out
    assert main(["explain", "--model", "qwen3-next-80b-a3b", "--json"]) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["kv_cache"]["bytes_per_token"] == 24_576
    assert data["kv_cache"]["state_bytes_per_sequence"] == 39_518_208


def test_the_engine_refuses_what_explain_only_prices(monkeypatch):
    import inferpath.config as config_module

    require_engine_support(DSV3)  # both run in the engine (tests/test_mla.py, tests/test_hybrid.py)
    require_engine_support(QNEXT)
    # an architecture explain prices and the engine lacks is refused by name
    monkeypatch.setattr(config_module, "PRICED_ARCHITECTURES", ("qwen3_next",))
    monkeypatch.setattr(config_module, "KIND_ARCHITECTURES", ("deepseek_v3",))
    with pytest.raises(ConfigError, match="'qwen3_next' is priced by explain but not implemented by the engine"):
        require_engine_support(QNEXT)
    # a kind field on an architecture the engine runs is refused too, by name
    llama = dataclasses.replace(MODEL_PRESETS["llama-3-8b"], routed_scaling_factor=2.5)
    with pytest.raises(ConfigError, match="routed_scaling_factor"):
        require_engine_support(llama)


@pytest.mark.parametrize("edit,name", [
    (dict(quantization_config={"quant_method": "fp8"}), "quantization_config"),
    (dict(topk_method="sparse"), "sparse"), (dict(moe_layer_freq=2), "moe_layer_freq"),
    (dict(hidden_act="gelu"), "gelu"), (dict(qk_head_dim=99), "qk_head_dim"),
])
def test_deepseek_config_fields_not_understood_are_refused_by_name(edit, name):
    with pytest.raises(ConfigError, match=name):
        ModelConfig.from_hf_config(_tiny_deepseek().to_dict() | edit)


def test_qwen3_next_fields_not_understood_are_refused_by_name():
    with pytest.raises(ConfigError, match="use_sliding_window"):
        ModelConfig.from_hf_config(_tiny_qwen3_next().to_dict() | {"use_sliding_window": True})
    with pytest.raises(ConfigError, match="layer_types"):
        ModelConfig.from_hf_config(_tiny_qwen3_next().to_dict() | {"layer_types": ["mamba"] * 4})
