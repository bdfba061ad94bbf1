"""ModelConfig's checks: each field in range, and the fields that exclude each other.

``ModelConfig.__post_init__`` (config.py) checks the architecture against its lists, then
calls ``check_model_config`` once: positive shapes, heads that group evenly, activations,
RoPE, norms, routers and experts the layers implement, each error a ConfigError naming the
value and what is allowed; the fields of layers of several kinds (MLA, DeepSeek MoE, linear
attention) are config_kinds.py's. Imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferpath.config_kinds import check_kinds
from inferpath.errors import ConfigError

if TYPE_CHECKING:
    from inferpath.config import ModelConfig


def check_model_config(config: ModelConfig) -> None:
    """ConfigError naming the first field of ``config`` out of range (its architecture aside)."""
    for field_name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                       "num_heads", "num_kv_heads", "head_dim"):
        value = getattr(config, field_name)
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{field_name} must be a positive integer, got {value!r}")
    if config.num_heads % config.num_kv_heads:
        raise ConfigError(
            f"num_heads ({config.num_heads}) must be a multiple of "
            f"num_kv_heads ({config.num_kv_heads})"
        )
    if config.hidden_act not in ("silu", "gelu", "gelu_pytorch_tanh"):
        raise ConfigError(f"hidden_act {config.hidden_act!r} is not supported; "
                          "supported: silu, gelu, gelu_pytorch_tanh")
    if config.num_experts and config.hidden_act != "silu":
        raise ConfigError(f"hidden_act {config.hidden_act!r} with experts is not supported (SiLU only)")
    if config.layer_types is not None and len(config.layer_types) != config.num_layers:
        raise ConfigError(f"layer_types has {len(config.layer_types)} entries for {config.num_layers} layers")
    if config.rotary_dim and (config.rotary_dim % 2 or config.rotary_dim > config.head_dim):
        raise ConfigError(f"rotary_dim ({config.rotary_dim}) must be even and at most head_dim ({config.head_dim})")
    if config.moe_router not in ("softmax", "sigmoid_grouped", "topk_softmax", "sigmoid_prescaled"):
        raise ConfigError(f"moe_router {config.moe_router!r} is not supported; "
                          "supported: softmax, sigmoid_grouped, topk_softmax, sigmoid_prescaled")
    if "chunked_attention" in (config.layer_types or ()) and config.attention_chunk_size <= 0:
        raise ConfigError("layer_types has chunked_attention layers but attention_chunk_size is "
                          f"{config.attention_chunk_size!r}; set a positive chunk size")
    if config.attn_temperature_floor < 0:
        raise ConfigError(f"attn_temperature_floor must be >= 0 (0: off), got {config.attn_temperature_floor!r}")
    if config.num_experts and (config.num_experts % config.num_expert_groups
                               or not 0 < config.num_topk_groups <= config.num_expert_groups):
        raise ConfigError(f"{config.num_experts} experts in {config.num_expert_groups} groups, the best "
                          f"{config.num_topk_groups} chosen: groups must divide the experts and be chosen 1..all")
    if config.qk_norm not in ("", "projection", "head", "l2_rope"):
        raise ConfigError(f"qk_norm {config.qk_norm!r} is not supported; supported: '', projection, head, l2_rope")
    if config.sandwich_norms and config.post_norms:
        raise ConfigError("sandwich_norms and post_norms exclude each other (Gemma's norms or OLMo 2's)")
    if any(not 0 <= i < config.num_layers for i in config.no_rope_layers):
        raise ConfigError(f"no_rope_layers {list(config.no_rope_layers)} must be layer indices below {config.num_layers}")
    if config.num_experts and not 0 < config.num_experts_per_tok <= config.num_experts:
        raise ConfigError(
            f"num_experts_per_tok ({config.num_experts_per_tok}) must be in "
            f"1..num_experts ({config.num_experts})"
        )
    check_kinds(config)  # MLA, DeepSeek MoE, linear attention
