"""Never load a model wrong: every config field, checkpoint tensor and GGUF key that the
model does not implement is refused with an error naming it.

The supported variants are checked against transformers' logits in test_model.py
(``CASES``); here, the other side of the table: what must not load.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from inferpath.config import ConfigError, ModelConfig
from inferpath.weights import WeightsError, load_checkpoint

import transformers  # test-only reference; a hard dependency of the test extras
from test_weights import hf_tensors, write_gguf


def tiny_dict(config_cls=transformers.LlamaConfig, **overrides) -> dict:
    """A tiny config as transformers writes it, with ``overrides`` edited into the dict."""
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return config_cls(**base).to_dict() | overrides


def qwen2_dict(**kwargs) -> dict:
    """A Qwen2 config built by transformers from ``kwargs`` (so layer_types follows them)."""
    return transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, **kwargs).to_dict()


# (what the config says, the name the error must carry)
REFUSED_CONFIGS = {
    "partial rotary": (tiny_dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    "sliding window on llama": (tiny_dict(sliding_window=8), "sliding_window"),
    "mlp_bias on qwen2": (tiny_dict(transformers.Qwen2Config, mlp_bias=True), "mlp_bias"),
    "logit softcapping": (tiny_dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
    "quantization config": (tiny_dict(quantization_config={"quant_method": "gptq"}), "quantization_config"),
    "relu activation": (tiny_dict(hidden_act="relu"), "relu"),
    "unknown rope type": (tiny_dict(rope_parameters={"rope_type": "su", "rope_theta": 1e4}), "su"),
    "unknown yarn key": (tiny_dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4,
                                                     "original_max_position_embeddings": 64,
                                                     "extrapolation_factor": 2.0}), "extrapolation_factor"),
    "partial rotary in rope parameters": (tiny_dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                     "partial_rotary_factor": 0.5}),
                                          "partial_rotary_factor"),
    "gemma 3 attention soft-capping": (tiny_dict(transformers.Gemma3TextConfig, pad_token_id=0,
                                                 attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    "gemma 2 bidirectional attention": (tiny_dict(transformers.Gemma2Config, pad_token_id=0,
                                                  use_bidirectional_attention=True), "use_bidirectional_attention"),
    "olmoe clip_qkv": (tiny_dict(transformers.OlmoeConfig, clip_qkv=8.0), "clip_qkv"),
    "gelu experts": (tiny_dict(transformers.MixtralConfig, hidden_act="gelu"), "gelu"),
    "layer types without a window": (tiny_dict(transformers.Qwen2Config, use_sliding_window=False,
                                               layer_types=["sliding_attention", "full_attention"]),
                                     "sliding_window"),
    # issue 20's families: what their transformers models do not have, or disagree on
    "qwen3 mlp bias": (tiny_dict(transformers.Qwen3Config, mlp_bias=True), "mlp_bias"),
    "qwen3-moe shared expert": (tiny_dict(transformers.Qwen3MoeConfig, shared_expert_intermediate_size=32),
                                "shared_expert_intermediate_size"),
    "smollm3 sliding layers without use_sliding_window": (
        tiny_dict(transformers.SmolLM3Config, sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
        "use_sliding_window"),
    "smollm3 no_rope_layers of the wrong length": (tiny_dict(transformers.SmolLM3Config, no_rope_layers=[1, 0, 1]),
                                                   "no_rope_layers"),
    "olmo2 clip_qkv": (tiny_dict(transformers.Olmo2Config, clip_qkv=8.0), "clip_qkv"),
    "granite moe fields": (tiny_dict(transformers.GraniteConfig, num_local_experts=4), "num_local_experts"),
    "ernie partial rotary": (tiny_dict(transformers.Ernie4_5Config, partial_rotary_factor=0.5),
                             "partial_rotary_factor"),
    "glm4-moe yarn key": (tiny_dict(transformers.Glm4MoeConfig, rope_parameters={
        "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5, "mrope_section": [1, 1]}),
        "mrope_section"),
}


@pytest.mark.parametrize("case", list(REFUSED_CONFIGS))
def test_unimplemented_config_field_is_refused_by_name(case):
    cfg, name = REFUSED_CONFIGS[case]
    with pytest.raises(ConfigError, match=name):
        ModelConfig.from_hf_config(cfg)


def test_harmless_and_implemented_fields_load():
    cfg = tiny_dict(attention_bias=True, mlp_bias=True, hidden_act="gelu_pytorch_tanh", head_dim=16,
                    pretraining_tp=2, attention_dropout=0.1, torch_dtype="bfloat16")
    config = ModelConfig.from_hf_config(cfg)
    assert (config.attention_bias, config.o_proj_bias, config.mlp_bias) == (True, True, True)
    assert (config.hidden_act, config.head_dim, config.q_size) == ("gelu_pytorch_tanh", 16, 64)
    qwen = ModelConfig.from_hf_config(qwen2_dict(use_sliding_window=True, sliding_window=4, max_window_layers=1))
    assert (qwen.attention_bias, qwen.o_proj_bias) == (True, False)
    assert [qwen.layer_window(i) for i in range(2)] == [0, 4]
    # Qwen2's sliding_window is ignored (transformers too) unless use_sliding_window
    assert ModelConfig.from_hf_config(qwen2_dict(sliding_window=4)).layer_window(1) == 0
    old_style = qwen2_dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)
    del old_style["layer_types"]  # configs written before layer_types existed
    assert ModelConfig.from_hf_config(old_style).layer_window(1) == 4


def save_dir(directory: Path, config: transformers.PreTrainedConfig, edit_config=None) -> Path:
    torch.manual_seed(0)
    model = getattr(transformers, type(config).__name__.replace("Config", "ForCausalLM"))(config)
    model.save_pretrained(directory)
    if edit_config is not None:
        path = directory / "config.json"
        path.write_text(json.dumps(edit_config(json.loads(path.read_text()))))
    return directory


def test_safetensors_tensor_the_config_does_not_use_is_refused(tmp_path: Path):
    config = transformers.LlamaConfig(**{k: v for k, v in tiny_dict(mlp_bias=True).items()
                                         if k in ("vocab_size", "hidden_size", "intermediate_size",
                                                  "num_hidden_layers", "num_attention_heads",
                                                  "num_key_value_heads", "mlp_bias")})
    directory = save_dir(tmp_path / "m", config, lambda c: c | {"mlp_bias": False})
    with pytest.raises(WeightsError, match=r"mlp\.down_proj\.bias.*not used"):
        load_checkpoint(directory)
    (directory / "config.json").write_text(json.dumps(
        json.loads((directory / "config.json").read_text()) | {"mlp_bias": True}))
    assert "model.layers.1.mlp.down_proj.bias" in load_checkpoint(directory).tensors


def test_gguf_unknown_metadata_key_is_refused(tmp_path: Path):
    tensors = hf_tensors(np.random.default_rng(0))
    good = write_gguf(tmp_path / "good.gguf", "llama", tensors)
    assert load_checkpoint(good).config.architecture == "llama"
    w = gguf.GGUFWriter(str(tmp_path / "softcap.gguf"), "llama")
    w.add_float32("llama.attn_logit_softcapping", 50.0)
    _copy_into(w, good)
    with pytest.raises(WeightsError, match=r"llama\.attn_logit_softcapping"):
        load_checkpoint(tmp_path / "softcap.gguf")


def test_gguf_partial_rotary_is_refused(tmp_path: Path):
    w = gguf.GGUFWriter(str(tmp_path / "partial.gguf"), "llama")
    w.add_rope_dimension_count(32)  # the head is 64 wide
    _copy_into(w, write_gguf(tmp_path / "good.gguf", "llama", hf_tensors(np.random.default_rng(0))))
    with pytest.raises(WeightsError, match=r"rope\.dimension_count = 32"):
        load_checkpoint(tmp_path / "partial.gguf")


def test_gguf_tensor_the_model_does_not_use_is_refused(tmp_path: Path):
    tensors = hf_tensors(np.random.default_rng(1), bias=True)
    tensors["blk.0.attn_output.bias"] = np.zeros(256, np.float32)  # Qwen2 has no o_proj bias
    with pytest.raises(WeightsError, match=r"o_proj\.bias.*blk\.0\.attn_output\.bias"):
        load_checkpoint(write_gguf(tmp_path / "m.gguf", "qwen2", tensors))


def test_gguf_llama_biases_are_read_from_the_tensors(tmp_path: Path):
    tensors = hf_tensors(np.random.default_rng(2))
    tensors["blk.0.attn_output.bias"] = np.ones(256, np.float32)
    tensors["blk.0.attn_q.bias"] = np.ones(256, np.float32)
    tensors["blk.0.attn_k.bias"] = np.ones(128, np.float32)
    tensors["blk.0.attn_v.bias"] = np.ones(128, np.float32)
    ckpt = load_checkpoint(write_gguf(tmp_path / "m.gguf", "llama", tensors))
    assert ckpt.config.o_proj_bias and ckpt.config.attention_bias
    assert torch.equal(ckpt.tensors["model.layers.0.self_attn.o_proj.bias"], torch.ones(256))


def _copy_into(writer: gguf.GGUFWriter, source: Path) -> None:
    """Finish ``writer`` with every key (but the architecture) and tensor of ``source``."""
    reader = gguf.GGUFReader(source)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = f.contents()
        kind = f.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, kind)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data).reshape(tuple(reversed([int(d) for d in t.shape]))),
                          raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@torch.inference_mode()
def test_phi3_directory_with_fused_projections_loads_and_matches(tmp_path: Path):
    """Phi-3 stores qkv_proj and gate_up_proj fused; the loader cuts them into the model's
    q/k/v and gate/up, and the logits equal transformers'."""
    from inferpath.model import build_model
    from test_model import PagedRunner, rel_err

    config = transformers.Phi3Config(vocab_size=64, pad_token_id=0, eos_token_id=2, hidden_size=32,
                                     intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2)
    directory = save_dir(tmp_path / "phi3", config)
    ckpt = load_checkpoint(directory)
    assert "model.layers.0.self_attn.k_proj.weight" in ckpt.tensors
    assert not any("qkv_proj" in name or "gate_up_proj" in name for name in ckpt.tensors)
    hf = transformers.Phi3ForCausalLM.from_pretrained(directory).eval()
    prompt = [5, 9, 17, 33, 2, 60]
    logits = PagedRunner(build_model(ckpt)).step([(0, prompt)])
    assert rel_err(logits[0], hf(torch.tensor([prompt])).logits[0, -1]) < 1e-4


def test_layers_past_the_last_are_ignored_only_where_the_family_says(tmp_path: Path):
    """GLM-4 MoE checkpoints carry multi-token-prediction layers past num_hidden_layers,
    which transformers does not load: not read here either. The same tensor in a Qwen3
    directory is a tensor the model does not use: refused."""
    from safetensors.torch import load_file, save_file

    glm = transformers.Glm4MoeConfig(**{k: v for k, v in tiny_dict().items() if k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads")}, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2)
    qwen3 = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2)
    for config, ignored in ((glm, True), (qwen3, False)):
        directory = save_dir(tmp_path / config.model_type, config)
        tensors = load_file(directory / "model.safetensors")
        tensors["model.layers.2.eh_proj.weight"] = torch.zeros(32, 64)  # layer 2 of 2: past the last
        save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
        if ignored:
            assert "model.layers.2.eh_proj.weight" not in load_checkpoint(directory).tensors
        else:
            with pytest.raises(WeightsError, match=r"model\.layers\.2\.eh_proj\.weight"):
                load_checkpoint(directory)


def test_tensor_parallelism_refuses_what_it_cannot_shard():
    from inferpath.parallel.tp import check_shardable

    for cfg, name in ((tiny_dict(attention_bias=True), "o_proj_bias"), (tiny_dict(mlp_bias=True), "mlp_bias"),
                      (tiny_dict(transformers.OlmoeConfig), "qk_norm"),
                      (tiny_dict(transformers.GraniteConfig), "granite")):
        with pytest.raises(ValueError, match=name):
            check_shardable(ModelConfig.from_hf_config(cfg), 2)
