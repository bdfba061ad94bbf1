"""DeepSeek-V3's checkpoint tensors (latent attention, DeepSeek MoE) and their shapes.

The other half of names.expected_shapes for MLA configs: exactly the tensors
model/mla.py and model/deepseek_moe.py load, in Hugging Face's names.
"""

from __future__ import annotations

import re

from inferpath.config import ModelConfig

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def deepseek_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, heads = config.hidden_size, config.num_heads
    nope, rope, v, r, qr = (config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim,
                            config.kv_lora_rank, config.q_lora_rank)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h),
                                          "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        a = p + "self_attn."
        if qr:
            shapes[a + "q_a_proj.weight"] = (qr, h)
            shapes[a + "q_a_layernorm.weight"] = (qr,)
            shapes[a + "q_b_proj.weight"] = (heads * (nope + rope), qr)
        else:
            shapes[a + "q_proj.weight"] = (heads * (nope + rope), h)
        shapes[a + "kv_a_proj_with_mqa.weight"] = (r + rope, h)
        shapes[a + "kv_a_layernorm.weight"] = (r,)
        shapes[a + "kv_b_proj.weight"] = (heads * (nope + v), r)
        shapes[a + "o_proj.weight"] = (h, heads * v)
        mlps = [(p + "mlp.", config.intermediate_size)]
        if config.is_moe_layer(i):
            shapes[p + "mlp.gate.weight"] = (config.num_experts, h)
            shapes[p + "mlp.gate.e_score_correction_bias"] = (config.num_experts,)
            width = config.expert_intermediate_size
            mlps = [(f"{p}mlp.experts.{e}.", width) for e in range(config.num_experts)]
            if config.num_shared_experts:
                mlps.append((p + "mlp.shared_experts.", width * config.num_shared_experts))
        for q, width in mlps:
            shapes[q + "gate_proj.weight"] = (width, h)
            shapes[q + "up_proj.weight"] = (width, h)
            shapes[q + "down_proj.weight"] = (h, width)
    return shapes


def is_mtp_tensor(name: str, config: ModelConfig) -> bool:
    """A tensor of the multi-token-prediction layers DeepSeek stores after the last layer."""
    m = _LAYER.match(name)
    return m is not None and int(m.group(1)) >= config.num_layers
