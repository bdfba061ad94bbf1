"""The per-architecture GGUF rules (weights/gguf_arch.py) that no converted tiny model
reaches: llama.cpp's defaults for what a file does not say, and refusals by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferpath.weights.errors import WeightsError
from inferpath.weights.gguf_arch import GGUF_ARCHITECTURES, sliding_layers
from inferpath.weights.gguf_keys import check_metadata_keys

PATH = Path("x.gguf")


def meta_of(values: dict):
    return lambda key, default=None: values.get(key, default)


def test_sliding_pattern_period_list_and_default() -> None:
    # llama.cpp's set_swa_pattern: the last layer of each period attends fully; 0 = all slide
    assert sliding_layers(meta_of({}), 7, 6, PATH) == [True] * 5 + [False, True]
    assert sliding_layers(meta_of({"attention.sliding_window_pattern": 2}), 4, 6, PATH) == [True, False] * 2
    assert sliding_layers(meta_of({"attention.sliding_window_pattern": 0}), 3, 6, PATH) == [True] * 3
    per_layer = [False, True, True]
    assert sliding_layers(meta_of({"attention.sliding_window_pattern": per_layer}), 3, 6, PATH) == per_layer
    with pytest.raises(WeightsError, match="2 entries for 3 layers"):
        sliding_layers(meta_of({"attention.sliding_window_pattern": [True, False]}), 3, 6, PATH)


def common(num_layers: int) -> dict:
    return {"num_hidden_layers": num_layers, "hidden_size": 5376, "num_attention_heads": 32, "head_dim": 128,
            "rope_theta": 10_000.0}


def test_gemma_attention_scale_follows_llama_cpp() -> None:
    gemma3 = GGUF_ARCHITECTURES["gemma3"].config_fields
    assert gemma3(meta_of({}), common(62), {}, PATH)["query_pre_attn_scalar"] == 168.0  # 27B: hidden / heads
    fields = gemma3(meta_of({"attention.sliding_window": 512}), common(26), {}, PATH)
    assert fields["query_pre_attn_scalar"] == 128.0 and fields["rope_local_base_freq"] == 10_000.0
    assert fields["layer_types"].count("full_attention") == 4 and fields["sliding_window"] == 512
    no_window = gemma3(meta_of({}), common(26), {}, PATH)
    assert set(no_window["layer_types"]) == {"full_attention"} and no_window["sliding_window"] is None
    gemma2 = GGUF_ARCHITECTURES["gemma2"].config_fields(meta_of({}), common(46), {}, PATH)
    assert gemma2["query_pre_attn_scalar"] == 168.0 and gemma2["sliding_window"] == 4096
    assert (gemma2["attn_logit_softcapping"], gemma2["final_logit_softcapping"]) == (50.0, 30.0)


def test_gemma2_separate_local_rope_base_is_refused() -> None:
    with pytest.raises(WeightsError, match="rope.freq_base_swa"):
        GGUF_ARCHITECTURES["gemma2"].config_fields(meta_of({"rope.freq_base_swa": 5e5}), common(26), {}, PATH)


def test_granite_without_logit_scale_is_refused_and_defaults_apply() -> None:
    granite = GGUF_ARCHITECTURES["granite"].config_fields
    with pytest.raises(WeightsError, match="granite.logit_scale"):
        granite(meta_of({}), common(2), {}, PATH)
    fields = granite(meta_of({"logit_scale": 8.0}), common(2), {}, PATH)
    assert fields["attention_multiplier"] == 128 ** -0.5 and fields["embedding_multiplier"] == 1.0


@pytest.mark.parametrize("arch, key", [("gemma2", "gemma2.attn_logit_softcapping"),
                                       ("qwen2moe", "qwen2moe.expert_shared_feed_forward_length")])
def test_own_keys_are_accepted_only_for_their_architecture(arch: str, key: str) -> None:
    check_metadata_keys({key: 1.0}, arch, PATH)
    with pytest.raises(WeightsError, match=key.replace(arch, "llama")):
        check_metadata_keys({key.replace(arch, "llama"): 1.0}, "llama", PATH)


def test_unknown_moe_key_is_refused_by_name() -> None:
    with pytest.raises(WeightsError, match="qwen3moe.expert_weights_scale"):
        check_metadata_keys({"qwen3moe.expert_weights_scale": 2.0}, "qwen3moe", PATH)
