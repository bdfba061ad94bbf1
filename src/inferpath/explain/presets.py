"""Named model shapes for the cost model, and turning ``--model`` into a ModelConfig.

The cost model needs only shapes, never weights, so a preset is a ModelConfig built from
the model's published ``config.json`` (quoted per entry). ``resolve_model_config`` also
accepts a ``config.json`` path, a model directory, a ``.gguf`` file (metadata only) and the
aliases of the packaged real models.
"""

from __future__ import annotations

from pathlib import Path

from inferpath.config import ModelConfig


def _llama3(name: str, hidden: int, inter: int, layers: int, heads: int, **kw) -> ModelConfig:
    return ModelConfig(
        architecture="llama", vocab_size=128_256, hidden_size=hidden, intermediate_size=inter,
        num_layers=layers, num_heads=heads, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
        rope_theta=500_000.0, name=name, **kw,
    )


MODEL_PRESETS: dict[str, ModelConfig] = {
    # meta-llama/Meta-Llama-3-8B config.json
    "llama-3-8b": _llama3("llama-3-8b", 4096, 14_336, 32, 32, max_position_embeddings=8192),
    # meta-llama/Meta-Llama-3-70B config.json (the seed's model: 80 layers, d 8,192,
    # 64 query / 8 KV heads, head_dim 128, FFN 28,672, vocab 128,256)
    "llama-3-70b": _llama3("llama-3-70b", 8192, 28_672, 80, 64, max_position_embeddings=8192),
    # meta-llama/Llama-3.1-405B config.json (llama3 RoPE scaling, factor 8)
    "llama-3.1-405b": _llama3(
        "llama-3.1-405b", 16_384, 53_248, 126, 128, max_position_embeddings=131_072,
        rope_scaling=(("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                      ("original_max_position_embeddings", 8192), ("rope_type", "llama3")),
    ),
    # mistralai/Mistral-7B-v0.1 config.json (sliding window 4,096)
    "mistral-7b": ModelConfig(
        architecture="mistral", vocab_size=32_000, hidden_size=4096, intermediate_size=14_336,
        num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
        rope_theta=10_000.0, max_position_embeddings=32_768, sliding_window=4096,
        name="mistral-7b",
    ),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts, 2 active per token
    "mixtral-8x7b": ModelConfig(
        architecture="mixtral", vocab_size=32_000, hidden_size=4096, intermediate_size=14_336,
        num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
        rope_theta=1e6, max_position_embeddings=32_768, num_experts=8, num_experts_per_tok=2,
        name="mixtral-8x7b",
    ),
    # Qwen/Qwen2.5-0.5B config.json (QKV bias, tied embeddings)
    "qwen2.5-0.5b": ModelConfig(
        architecture="qwen2", vocab_size=151_936, hidden_size=896, intermediate_size=4864,
        num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6,
        rope_theta=1e6, max_position_embeddings=32_768, tie_word_embeddings=True,
        attention_bias=True, name="qwen2.5-0.5b",
    ),
    # HuggingFaceTB/SmolLM2-135M config.json (tied embeddings)
    "smollm2-135m": ModelConfig(
        architecture="llama", vocab_size=49_152, hidden_size=576, intermediate_size=1536,
        num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5,
        rope_theta=100_000.0, max_position_embeddings=8192, tie_word_embeddings=True,
        name="smollm2-135m",
    ),
    # deepseek-ai/DeepSeek-V3 config.json (the same shapes as DeepSeek-R1): 61 layers, d 7,168,
    # 128 heads; MLA with q_lora_rank 1,536, kv_lora_rank 512, RoPE dim 64, nope dim 128,
    # value dim 128; the first 3 layers a dense FFN of 18,432, then 256 routed experts of
    # 2,048 top-8 (sigmoid scores, correction bias, 8 groups, top 4 groups, scaled by 2.5)
    # and 1 shared expert; YaRN factor 40 over 4,096 positions (mscale 1.0 on both)
    "deepseek-v3": ModelConfig(
        architecture="deepseek_v3", vocab_size=129_280, hidden_size=7168, intermediate_size=18_432,
        num_layers=61, num_heads=128, num_kv_heads=128, head_dim=192, rms_norm_eps=1e-6,
        rope_theta=10_000.0, max_position_embeddings=163_840,
        rope_scaling=(("beta_fast", 32), ("beta_slow", 1), ("factor", 40), ("mscale", 1.0),
                      ("mscale_all_dim", 1.0), ("original_max_position_embeddings", 4096), ("type", "yarn")),
        num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048, dense_layers=(0, 1, 2),
        kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        num_shared_experts=1, router_scoring="sigmoid", router_correction_bias=True, n_group=8,
        topk_group=4, routed_scaling_factor=2.5, rope_interleave=True, name="deepseek-v3",
    ),
    # Qwen/Qwen3-Next-80B-A3B-Instruct config.json: 48 layers, d 2,048; every 4th layer gated
    # full attention (16 query / 2 KV heads of 256, RoPE on a quarter of head_dim), the others
    # Gated DeltaNet (16 key heads / 32 value heads of 128, conv kernel 4); every layer 512
    # experts of 512 top-10 plus a shared expert of 512
    "qwen3-next-80b-a3b": ModelConfig(
        architecture="qwen3_next", vocab_size=151_936, hidden_size=2048, intermediate_size=5120,
        num_layers=48, num_heads=16, num_kv_heads=2, head_dim=256, rms_norm_eps=1e-6,
        rope_theta=10_000_000.0, max_position_embeddings=262_144,
        num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, qk_norm="head", norm_weight_offset=1.0,
        layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(48)),
        attn_output_gate=True, partial_rotary_factor=0.25, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, name="qwen3-next-80b-a3b",
    ),
}

# Aliases of the packaged real models (inferpath.models) resolve to a GGUF file.
REAL_MODEL_ALIASES = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")


def resolve_model_config(spec: str) -> ModelConfig:
    """A preset name, a real-model alias, a ``config.json``/model directory or a ``.gguf``."""
    key = spec.lower()
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    path = Path(spec).expanduser()
    if key in REAL_MODEL_ALIASES and not path.exists():
        from inferpath.models import resolve_model  # weights helper; pulls on first use

        path = Path(resolve_model(spec))
        return config_from_path(path).with_name(key)
    if path.exists():
        return config_from_path(path)
    raise ValueError(
        f"unknown model {spec!r}: not a preset ({', '.join(MODEL_PRESETS)}), "
        f"not an alias ({', '.join(REAL_MODEL_ALIASES)}), and no such file"
    )


def config_from_path(path: Path) -> ModelConfig:
    """Shapes from a model directory, a ``config.json`` or a ``.gguf`` (header only)."""
    if path.is_dir():
        if (path / "config.json").exists():
            return ModelConfig.from_json_file(path / "config.json")
        ggufs = sorted(path.glob("*.gguf"))
        if not ggufs:
            raise ValueError(f"{path}: a model directory needs config.json or a .gguf file")
        path = ggufs[0]
    if path.suffix == ".gguf":
        from inferpath.explain.gguf_config import gguf_model_config

        return gguf_model_config(path)
    if path.suffix == ".json":
        return ModelConfig.from_json_file(path)
    raise ValueError(f"{path}: expected a config.json, a model directory or a .gguf file")
