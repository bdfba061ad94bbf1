"""The cost model keeps up with the families: QK norms, sinks, routed and shared experts,
sliding and full layers, post norms, Granite's multipliers.

Against independent counts: the parameters of tiny transformers models built from each
family's config, figures computed by hand for tiny and published configurations
(Qwen3-30B-A3B's experts read a decode token), and ``inferpath explain`` naming them.
"""

from __future__ import annotations

import json

import pytest
import transformers  # test-only reference

from inferpath.cli import main
from inferpath.config import ModelConfig
from inferpath.explain.cost import Precision, pass_cost
from inferpath.explain.hardware import HARDWARE_PRESETS
from inferpath.explain.layer_cost import STAGE_ORDER
from inferpath.explain.params import weight_breakdown

H100 = HARDWARE_PRESETS["h100-sxm"]
BF16 = Precision("bf16")
BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
FAMILIES = {
    "qwen3": lambda: transformers.Qwen3Config(**BASE),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**BASE, num_experts=8, num_experts_per_tok=2,
                                                     moe_intermediate_size=16, decoder_sparse_step=2),
    "gpt_oss": lambda: transformers.GptOssConfig(**BASE, num_local_experts=4, num_experts_per_tok=2),
    "gemma3_text": lambda: transformers.Gemma3TextConfig(**BASE, sliding_window=16),
    "gemma2": lambda: transformers.Gemma2Config(**BASE, sliding_window=16),
    "olmo2": lambda: transformers.Olmo2Config(**BASE),
    "granite": lambda: transformers.GraniteConfig(**BASE, embedding_multiplier=12.0, residual_multiplier=0.22,
                                                  logits_scaling=8.0, attention_multiplier=0.015),
    "glm4_moe": lambda: transformers.Glm4MoeConfig(**BASE, n_routed_experts=8, num_experts_per_tok=2,
                                                   moe_intermediate_size=16, first_k_dense_replace=1, n_group=1,
                                                   topk_group=1),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(**BASE, num_experts=4, num_experts_per_tok=2,
                                                     moe_intermediate_size=16, shared_expert_intermediate_size=24),
}
# Qwen/Qwen3-30B-A3B's config.json, as transformers 5.24 reads it
QWEN3_30B_A3B = dict(vocab_size=151_936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                     num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                     num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
                     norm_topk_prob=True, max_position_embeddings=40_960, rms_norm_eps=1e-6)


def _config(hf) -> ModelConfig:
    return ModelConfig.from_hf_config(hf.to_dict())


@pytest.mark.parametrize("family", FAMILIES)
def test_parameters_equal_a_transformers_model_of_the_family(family):
    """Every parameter the model holds is in one stage (sinks, QK and post norms, router
    and expert biases, shared experts and their gate included), for prefill and decode."""
    hf = FAMILIES[family]()
    model = transformers.AutoModelForCausalLM.from_config(hf)
    in_model = sum(t.numel() for t in model.state_dict().values())
    shared = hf.vocab_size * hf.hidden_size if hf.tie_word_embeddings else 0
    config = _config(hf)
    assert weight_breakdown(config, 2).total_params == in_model - shared
    for tokens, past in ((5, 0), (1, 9)):
        p = pass_cost(config, H100, BF16, tokens, tokens + past)
        assert sum(s.params for s in p.stages) == in_model
        for total in ("flops", "bytes_read", "weight_bytes", "time_s"):
            assert getattr(p, total) == pytest.approx(sum(getattr(s, total) for s in p.stages))
        assert [s.name for s in p.stages] == [n for n in STAGE_ORDER if n in {s.name for s in p.stages}]


def test_qwen3_qk_norm_is_a_stage_over_each_head():
    config = _config(FAMILIES["qwen3"]())
    p = pass_cost(config, H100, BF16, 3, 3)
    norm = p.stage("qk_norm")
    # 4 layers x 3 tokens x (4 query + 2 key heads) x 8 values: 4 FLOPs a value; weights: 2 x head_dim a layer
    assert norm.flops == 4 * 4 * 3 * (4 + 2) * 8
    assert norm.params == 4 * 2 * 8
    assert norm.bytes_written == 4 * 3 * (4 + 2) * 8 * 2


def test_olmo2_norms_follow_attention_and_the_mlp():
    config = _config(FAMILIES["olmo2"]())
    names = {s.name for s in pass_cost(config, H100, BF16, 1, 4).stages}
    assert {"post_attn_norm", "post_ffn_norm", "qk_norm"} <= names
    assert not names & {"rmsnorm_attn", "rmsnorm_ffn"}
    assert pass_cost(config, H100, BF16, 1, 4).stage("qk_norm").params == 4 * (4 + 2) * 8  # full width


def test_gpt_oss_sinks_and_sliding_layers_by_hand():
    """gpt-oss: a sink logit per head in every softmax; every other layer slides (window
    16 here): at 100 cached tokens a decode step's sliding layers read 16 keys, the full ones 100."""
    hf = transformers.GptOssConfig(**BASE, num_local_experts=4, num_experts_per_tok=2, sliding_window=16)
    config = _config(hf)
    p = pass_cost(config, H100, BF16, 1, 100)
    sinks = p.stage("attn_sinks")
    assert sinks.count == 4 and sinks.params == 4 * 4 and sinks.flops == 4 * 3 * 4
    kv = 2 * 8  # KV heads x head_dim
    q_read = 4 * 8 * 2
    # two sliding layers (16 keys), two full (100 keys); K at bf16
    assert p.stage("attn_scores").bytes_read == 2 * (q_read + 16 * kv * 2) + 2 * (q_read + 100 * kv * 2)
    assert p.stage("attn_scores").flops == 2 * (2 * 16 * 4 * 8 + 16 * 4) + 2 * (2 * 100 * 4 * 8 + 100 * 4)


def test_gemma_sliding_and_full_layers_cost_apart():
    hf = transformers.Gemma3TextConfig(**BASE | {"num_hidden_layers": 6}, sliding_window=16)
    config = _config(hf)  # gemma3: 5 sliding layers, then a full one
    p = pass_cost(config, H100, BF16, 1, 200)
    kv = 2 * 8
    assert p.stage("attn_scores").bytes_read == 5 * (4 * 8 * 2 + 16 * kv * 2) + (4 * 8 * 2 + 200 * kv * 2)
    names = {s.name for s in p.stages}
    assert {"embedding_scale", "post_attn_norm", "post_ffn_norm", "qk_norm"} <= names


def test_granite_multipliers_are_named_stages():
    config = _config(FAMILIES["granite"]())
    p = pass_cost(config, H100, BF16, 2, 2)
    assert p.stage("embedding_scale").flops == 2 * 32
    assert p.stage("residual_scale").count == 4 and p.stage("residual_scale").flops == 4 * 2 * 2 * 32
    assert p.stage("logit_scale").flops == 64  # the last position's logits only
    plain = _config(transformers.GraniteConfig(**BASE))  # multipliers of 1: nothing computed, nothing named
    assert not {"embedding_scale", "residual_scale", "logit_scale"} & {s.name for s in pass_cost(
        plain, H100, BF16, 2, 2).stages}


def test_qwen3_30b_a3b_decode_reads_its_active_experts_by_hand():
    """A decode token touches 8 of 128 experts in each of 48 layers: 8 x 3 x 2048 x 768
    values a layer, 3.62 GB in bf16; the router reads all of its 128 x 2048 weights."""
    config = ModelConfig.from_hf_config({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                                         **QWEN3_30B_A3B})
    p = pass_cost(config, H100, BF16, 1, 1000)
    experts = sum(p.stage(n).weight_bytes for n in ("gate_proj", "up_proj", "down_proj"))
    assert experts == pytest.approx(48 * 8 * 3 * 2048 * 768 * 2)  # 3,623,878,656 bytes
    assert p.stage("router").weight_bytes == 48 * 128 * 2048 * 2
    assert weight_breakdown(config, 2).active_params == pytest.approx(3.3e9, rel=0.03)  # "A3B"
    # eight sequences at once touch more experts: E (1 - (1 - k/E)^8) a layer, expected
    eight = pass_cost(config, H100, BF16, 1, 1000, batch=8)
    touched = 128 * (1 - (1 - 8 / 128) ** 8)
    assert sum(eight.stage(n).weight_bytes for n in ("gate_proj", "up_proj", "down_proj")) == pytest.approx(
        48 * touched * 3 * 2048 * 768 * 2)


def test_shared_experts_are_read_whole_every_step():
    config = _config(FAMILIES["qwen2_moe"]())
    p = pass_cost(config, H100, BF16, 1, 10)
    assert p.stage("shared_up_proj").weight_bytes == 4 * 32 * 24 * 2  # every layer, the whole expert
    assert p.stage("up_proj").weight_bytes == 4 * 2 * 32 * 16 * 2  # top-2 of 4 routed


def test_explain_names_the_routed_experts_of_a_qwen3_moe(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"],
                                                      "model_type": "qwen3_moe", **QWEN3_30B_A3B}))
    # bf16 named: "auto" is the machine's (float32 on a CPU without AVX-512 BF16)
    assert main(["explain", "--model", str(tmp_path), "--hardware", "h100-sxm", "--prompt-tokens", "7",
                 "--output-tokens", "4", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "8 of 128 experts" in out
    assert "top-8 of 128 a token in each of 48 MoE layers, 3.624 GB of expert weights" in out
    assert "qk_norm" in out


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "gemma3_text", "olmo2", "granite"])
def test_the_trace_prices_every_stage_of_the_family_in_one_row(family, tmp_path):
    """A tiny model of the family served and traced: each cost-model stage of each step
    falls in exactly one measured row (the routed and shared experts in the MoE's row), so
    the rows' predictions add up to the step's."""
    from gguf_convert import save_tiny

    from inferpath import LLM, SamplingParams
    from inferpath.engine.trace import trace
    from inferpath.explain.trace import request_trace

    hf = FAMILIES[family]()
    hf.vocab_size = 128_256  # the Llama-3 tokenizer's
    save_tiny(hf, tmp_path, "llama3")
    llm = LLM(str(tmp_path), max_num_seqs=2)
    with trace(llm.engine) as tracer:
        (out,) = llm.generate("The capital of France is", SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    view = request_trace(tracer, out.request_id, llm.engine, H100)
    for step in view["steps"]:
        covered = [name for row in step["stages"] for name in row["covers"]]
        expected = pass_cost(llm.engine.model_config, H100, Precision("fp32"), step["num_new_tokens"],
                             step["context_len"], fused_attention=True)
        assert sorted(covered) == sorted(s.name for s in expected.stages if s.name != "tokenize")
        assert sum(r["predicted_s"] or 0 for r in step["stages"]) == pytest.approx(step["predicted_s"])
        if llm.engine.model_config.is_moe:  # the routers' choices, through either form of experts
            k = llm.engine.model_config.num_experts_per_tok
            assert step["experts"]["layers"] and all(
                k <= layer["distinct"] <= k * step["num_new_tokens"] for layer in step["experts"]["layers"])
        else:
            assert step["experts"] is None
    if family == "qwen3_moe":
        moe = next(r for r in view["summary"] if "router" in r["covers"])
        assert {"gate_proj", "up_proj", "down_proj"} <= set(moe["covers"])
