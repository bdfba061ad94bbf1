"""Qwen3-Next's and Qwen3.5's checkpoint tensors (Gated DeltaNet and gated attention layers, experts with
a shared expert) and their shapes: the other half of names.expected_shapes for it."""

from __future__ import annotations

from inferpath.config import ModelConfig
from inferpath.config_kinds import linear_conv_dim, linear_key_dim, linear_value_dim


def qwen3_next_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, hd = config.hidden_size, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h),
                                          "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    kd, vd, hv = linear_key_dim(config), linear_value_dim(config), config.linear_num_value_heads
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        if config.is_linear_attention_layer(i):
            a = p + "linear_attn."
            shapes |= {a + "dt_bias": (hv,), a + "A_log": (hv,),
                       a + "conv1d.weight": (linear_conv_dim(config), 1, config.linear_conv_kernel_dim),
                       a + "norm.weight": (config.linear_value_head_dim,), a + "out_proj.weight": (h, vd)}
            if config.linear_split_projections:  # Qwen3.5
                shapes |= {a + "in_proj_qkv.weight": (2 * kd + vd, h), a + "in_proj_z.weight": (vd, h),
                           a + "in_proj_b.weight": (hv, h), a + "in_proj_a.weight": (hv, h)}
            else:
                shapes |= {a + "in_proj_qkvz.weight": (2 * kd + 2 * vd, h), a + "in_proj_ba.weight": (2 * hv, h)}
        else:
            a = p + "self_attn."
            shapes |= {a + "q_proj.weight": (2 * config.q_size, h), a + "k_proj.weight": (config.kv_size, h),
                       a + "v_proj.weight": (config.kv_size, h), a + "o_proj.weight": (h, config.q_size),
                       a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)}
        mlps = [(p + "mlp.", config.intermediate_size)]
        if config.is_moe_layer(i):
            shapes[p + "mlp.gate.weight"] = (config.num_experts, h)
            mlps = [(f"{p}mlp.experts.{e}.", config.expert_intermediate_size) for e in range(config.num_experts)]
            if config.shared_expert_intermediate_size:
                mlps.append((p + "mlp.shared_expert.", config.shared_expert_intermediate_size))
                shapes[p + "mlp.shared_expert_gate.weight"] = (1, h)
        for q, width in mlps:
            shapes[q + "gate_proj.weight"] = (width, h)
            shapes[q + "up_proj.weight"] = (width, h)
            shapes[q + "down_proj.weight"] = (h, width)
    return shapes
