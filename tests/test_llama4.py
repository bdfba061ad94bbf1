"""Llama 4 text (``llama4_text``) from Hugging Face directories, against transformers.

Tiny random models built by transformers 5.24 from Llama4TextConfig, saved and loaded by
inferpath as in test_families.py (three sequences sharing steps, prefill plus 8 decode
steps, every row against transformers' own cache decode of that sequence alone, kernels
off and on). The variants cover what Llama 4 adds: MoE and dense layers interleaved, the
shared expert, top-1 and top-2 sigmoid routing on pre-scaled inputs, NoPE layers,
chunked attention on the RoPE layers (chunks of 5 < the sequences), the QK L2-norm, and
the NoPE layers' temperature (floor_scale small enough that it changes the queries).
"""

from __future__ import annotations

import json

import pytest
import torch

from inferpath.config import ConfigError, ModelConfig
from inferpath.families import native_decode_refusal
from test_families import BASE, TOLERANCE, max_differences, save_random_model

import transformers  # test-only reference

CASES = {
    # the released models' shape in small: every 2nd layer MoE, every 2nd layer NoPE
    "llama4-interleaved-chunked": lambda: transformers.Llama4TextConfig(**(BASE | dict(
        num_hidden_layers=4, head_dim=16, intermediate_size=32, intermediate_size_mlp=128, num_local_experts=4,
        interleave_moe_layer_step=2, no_rope_layer_interval=2, attention_chunk_size=5, floor_scale=4,
        attn_scale=0.5))),
    # every layer MoE, top-2, biases, tied, no QK-norm, no chunks, NoPE layers listed
    "llama4-top2-bias-tied": lambda: transformers.Llama4TextConfig(**(BASE | dict(
        num_hidden_layers=3, head_dim=16, intermediate_size=32, intermediate_size_mlp=96, num_local_experts=4,
        num_experts_per_tok=2, no_rope_layers=[1, 0, 1], attention_chunk_size=None, use_qk_norm=False,
        attention_bias=True, tie_word_embeddings=True, floor_scale=3, attn_scale=0.3))),
    # moe_layers given, temperature tuning off, head_dim from hidden / heads
    "llama4-moe-layers-no-tuning": lambda: transformers.Llama4TextConfig(**(BASE | dict(
        num_hidden_layers=3, intermediate_size=32, intermediate_size_mlp=128, num_local_experts=3,
        moe_layers=[0], no_rope_layer_interval=3, attention_chunk_size=4, attn_temperature_tuning=False))),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    made = {}

    def get(case):
        if case not in made:
            made[case] = save_random_model(CASES[case](), tmp_path_factory.mktemp(case))
        return made[case]
    return get


@pytest.mark.parametrize("cpu_kernels", [False, True], ids=["torch", "cpu-kernels"])
@pytest.mark.parametrize("case", list(CASES))
def test_llama4_directory_matches_transformers_batched(case, cpu_kernels, saved):
    torch.set_num_threads(1)
    rel, absolute = max_differences(case, saved(case), cpu_kernels)
    print(f"{case} cpu_kernels={cpu_kernels}: max relative {rel:.2e}, max absolute {absolute:.2e}")
    assert rel < TOLERANCE


def test_llama4_config_reads_its_layers(saved):
    config = ModelConfig.from_json_file(saved("llama4-interleaved-chunked") / "config.json")
    assert config.dense_layers == (0, 2) and config.no_rope_layers == (1, 3)
    assert [config.layer_chunk(i) for i in range(4)] == [5, 0, 5, 0]
    assert config.intermediate_size == 128 and config.expert_intermediate_size == 32
    assert config.shared_expert_intermediate_size == 32 and config.qk_norm == "l2_rope"
    assert (config.attn_temperature_floor, config.attn_temperature_scale) == (4, 0.5)


@pytest.mark.parametrize("case", list(CASES))
def test_the_allow_list_keeps_native_decode_off_for_llama4(case, saved):
    config = ModelConfig.from_json_file(saved(case) / "config.json")
    assert "llama4_text" in native_decode_refusal(config)


def test_a_llama4_config_on_the_native_families_list_is_still_refused_for_its_fields(saved, monkeypatch):
    """Were the family granted, its chunked attention and temperature would still keep the
    native step off (the per-field list)."""
    from dataclasses import replace

    from inferpath import families

    config = ModelConfig.from_json_file(saved("llama4-interleaved-chunked") / "config.json")
    granted = dict(families.FAMILIES, llama4_text=replace(families.FAMILIES["llama4_text"], native_decode=True))
    monkeypatch.setattr(families, "FAMILIES", granted)
    refusal = native_decode_refusal(config)
    assert refusal and "llama4_text" not in refusal


def _config_dict(saved) -> dict:
    return json.loads((saved("llama4-interleaved-chunked") / "config.json").read_text())


@pytest.mark.parametrize("field, value", [("rope_scaling_extra_field", 1), ("sliding_window", 4),
                                          ("mlp_bias", True)])
def test_an_unread_field_is_refused_by_name(saved, field, value):
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_hf_config(_config_dict(saved) | {field: value})


@pytest.mark.parametrize("changes, named", [
    (dict(attention_chunk_size=None), "attention_chunk_size"),
    (dict(layer_types=["sliding_attention"] * 4), "layer_types"),
    (dict(no_rope_layers=[1, 0, 2, 0]), "no_rope_layers"),
    (dict(moe_layers=[7]), "moe_layers"),
    (dict(floor_scale=0), "floor_scale"),
    (dict(hidden_act="gelu"), "gelu"),
])
def test_a_value_llama4_does_not_define_is_refused_by_name(saved, changes, named):
    with pytest.raises(ConfigError, match=named):
        ModelConfig.from_hf_config(_config_dict(saved) | changes)
