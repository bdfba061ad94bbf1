"""ModelConfig's layers of more than one kind: latent attention, DeepSeek MoE, linear attention.

Llama-family models repeat one layer; DeepSeek-V3 and Qwen3-Next do not. DeepSeek-V3's
first ``first_k_dense_replace`` layers have a dense FFN and the rest experts (``dense_layers``),
its attention is multi-head latent attention (MLA, ``kv_lora_rank > 0``); Qwen3-Next puts a
full-attention layer after every three Gated DeltaNet (linear-attention) layers
(``layer_types``). This file validates those fields once and says, per layer, which kind
it is, so that the cost model (explain/layer_cost.py) can price each kind and sum.

Invariant: ``layer_kinds(config)`` covers every layer exactly once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferpath.config import ModelConfig

LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention", "chunked_attention")
ROUTER_SCORINGS = ("softmax", "sigmoid")
# ModelConfig fields (and their "nothing" value) that only the cost model reads so far
KIND_FIELDS = {
    "kv_lora_rank": 0, "q_lora_rank": 0, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0, "v_head_dim": 0,
    "num_shared_experts": 0, "router_scoring": "softmax", "router_correction_bias": False, "n_group": 1,
    "topk_group": 1, "routed_scaling_factor": 1.0, "linear_num_key_heads": 0, "linear_num_value_heads": 0,
    "linear_key_head_dim": 0, "linear_value_head_dim": 0, "linear_conv_kernel_dim": 0,
    "attn_output_gate": False, "partial_rotary_factor": 1.0, "rope_interleave": False,
    "linear_split_projections": False,
}
# architecture -> the kind fields its engine implementation reads (the rest must be "nothing")
ENGINE_READS = {
    "deepseek_v3": frozenset({"kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                              "num_shared_experts", "router_scoring", "router_correction_bias", "n_group",
                              "topk_group", "routed_scaling_factor", "rope_interleave"}),
    # GLM-4 MoE's grouped sigmoid router (model/moe.py GroupedSigmoidMoE) scales its weights too
    "glm4_moe": frozenset({"routed_scaling_factor"}),
    "qwen3_next": frozenset({"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                             "linear_value_head_dim", "linear_conv_kernel_dim", "attn_output_gate",
                             "partial_rotary_factor"}),
}
# Qwen3.5, dense and MoE: Qwen3-Next's layers with the linear projections stored apart
ENGINE_READS["qwen3_5_text"] = ENGINE_READS["qwen3_5_moe_text"] = ENGINE_READS["qwen3_next"] | {"linear_split_projections"}


def _error(message: str) -> Exception:
    from inferpath.config import ConfigError

    return ConfigError(message)


def check_kinds(config: ModelConfig) -> None:
    """ConfigError naming the first MLA, router or linear-attention field out of range."""
    if config.layer_types is not None and not set(config.layer_types) <= set(LAYER_TYPES):
        bad = sorted(set(config.layer_types) - set(LAYER_TYPES))
        raise _error(f"layer_types names {bad[0]!r}; each layer must be one of {', '.join(LAYER_TYPES)}")
    if config.kv_lora_rank:
        for name in ("qk_rope_head_dim", "v_head_dim"):
            if getattr(config, name) <= 0:
                raise _error(f"{name} must be positive with kv_lora_rank = {config.kv_lora_rank} (MLA), "
                             f"got {getattr(config, name)!r}")
        if config.qk_nope_head_dim < 0 or config.q_lora_rank < 0:
            raise _error("qk_nope_head_dim and q_lora_rank must be >= 0 "
                         f"(got {config.qk_nope_head_dim}, {config.q_lora_rank})")
    if config.router_scoring not in ROUTER_SCORINGS:
        raise _error(f"router_scoring {config.router_scoring!r} is not one of {', '.join(ROUTER_SCORINGS)}")
    if config.n_group < 1 or not 1 <= config.topk_group <= config.n_group:
        raise _error(f"need n_group >= 1 and 1 <= topk_group <= n_group, got n_group {config.n_group}, "
                     f"topk_group {config.topk_group}")
    if config.num_experts and config.num_experts % config.n_group:
        raise _error(f"num_experts ({config.num_experts}) must be a multiple of n_group ({config.n_group})")
    if config.num_linear_layers:
        dims = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim")
        for name in dims:
            if getattr(config, name) <= 0:
                raise _error(f"{name} must be positive when layer_types has linear_attention layers, "
                             f"got {getattr(config, name)!r}")
        if config.linear_num_value_heads % config.linear_num_key_heads:
            raise _error(f"linear_num_value_heads ({config.linear_num_value_heads}) must be a multiple of "
                         f"linear_num_key_heads ({config.linear_num_key_heads})")
    if not 0 < config.partial_rotary_factor <= 1:
        raise _error(f"partial_rotary_factor must be in (0, 1], got {config.partial_rotary_factor!r}")


def engine_unsupported_fields(config: ModelConfig) -> list[str]:
    """The kind fields set away from "nothing" that the engine does not implement (for
    DeepSeek-V3: sigmoid scores with the correction bias only, as transformers runs it)."""
    reads = ENGINE_READS.get(config.architecture, frozenset())
    fields = [name for name, nothing in KIND_FIELDS.items() if name not in reads and getattr(config, name) != nothing]
    if config.architecture == "deepseek_v3" and config.is_moe and (
            config.router_scoring != "sigmoid" or not config.router_correction_bias):
        fields.append("router_scoring" if config.router_scoring != "sigmoid" else "router_correction_bias")
    if config.architecture == "deepseek_v3" and not config.is_mla:
        fields.append("kv_lora_rank")
    return fields


# ------------------------------------------------------------------ shapes per kind
def linear_key_dim(config: ModelConfig) -> int:
    return config.linear_num_key_heads * config.linear_key_head_dim


def linear_value_dim(config: ModelConfig) -> int:
    return config.linear_num_value_heads * config.linear_value_head_dim


def linear_conv_dim(config: ModelConfig) -> int:
    """Channels of the short convolution: q and k (key dim each) and v (value dim)."""
    return 2 * linear_key_dim(config) + linear_value_dim(config)


def linear_state_values(config: ModelConfig) -> int:
    """Values of one linear layer's per-sequence state: the convolution's last
    (kernel - 1) inputs per channel, and one key_dim x value_dim matrix per value head."""
    if not config.linear_num_value_heads:
        return 0
    conv = linear_conv_dim(config) * (config.linear_conv_kernel_dim - 1)
    delta = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    return conv + delta


def shared_expert_size(config: ModelConfig) -> int:
    """Width of the always-on expert(s): DeepSeek's n_shared_experts x moe_intermediate_size,
    or Qwen's shared_expert_intermediate_size; 0 for none."""
    if config.num_shared_experts:
        return config.num_shared_experts * config.expert_intermediate_size
    return config.shared_expert_intermediate_size


@dataclass(frozen=True)
class LayerKind:
    """What a layer is made of: its attention ("gqa", "mla" or "linear", with its sliding
    window, 0 for none) and its FFN ("dense" or "moe")."""

    attention: str
    window: int
    ffn: str


def layer_kind(config: ModelConfig, layer_idx: int) -> LayerKind:
    if config.is_linear_attention_layer(layer_idx):
        attention = "linear"
    else:
        attention = "mla" if config.is_mla else "gqa"
    return LayerKind(attention=attention, window=config.layer_window(layer_idx) if attention == "gqa" else 0,
                     ffn="moe" if config.is_moe_layer(layer_idx) else "dense")


def layer_kinds(config: ModelConfig) -> list[tuple[LayerKind, int]]:
    """[(kind, number of layers of that kind)] in order of first appearance."""
    return list(Counter(layer_kind(config, i) for i in range(config.num_layers)).items())


def has_layer_kinds(config: ModelConfig) -> bool:
    """True when the layers differ, or use latent attention or shared experts: then explain
    prices kind by kind (explain/layer_cost.py) instead of one layer times num_layers."""
    return (config.is_mla or config.num_linear_layers > 0 or bool(shared_expert_size(config))
            or (config.is_moe and bool(config.dense_layers)) or config.attn_output_gate)
