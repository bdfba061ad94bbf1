"""The family table: one data entry per architecture, and the capabilities it grants.

A family is data (design.md): what differs between architectures is an entry here, the
layers read ModelConfig's flags, and a capability is granted by the entry, never assumed.
Each ``Family`` says which ``config.json`` fields the family reads beyond the common ones
(hf_config.py refuses any other), where its experts live, which projections its
checkpoints store fused, whether its Q/K rows are stored for interleaved RoPE, and what may
run it: tensor parallelism (parallel/tp.py) and the native decode step
(kernels/decode_stack.py).

The native decode step is granted **positively**, twice over: the family must allow it
(``native_decode``), and every field of the ModelConfig must hold a value that the native
step implements (``NATIVE_DECODE_FIELDS``). A field the table does not list, a value
outside what it lists, or a family not in ``FAMILIES`` keeps native decode off: a feature
added to ModelConfig later never reaches a kernel that was not written for it.

Imports neither torch nor the config module (config.py reads this table).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

# Phi-3's checkpoints store Q/K/V and gate/up fused along rows: fused suffix -> its parts
_PHI3_FUSED = {
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}
_QWEN2_WINDOW = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})


@dataclass(frozen=True)
class Family:
    """One architecture (``model_type``) and what may run it.

    Invariants: ``config_fields`` are read by hf_config.py (or known to change nothing in
    transformers' model of this family); ``native_decode`` and ``tensor_parallel`` are
    granted only where a test compares that path with transformers or with the module path.
    """

    architecture: str
    config_fields: frozenset[str]
    routed_moe: bool = False  # experts under ``mlp`` with Llama names (model/moe.py RoutedMoE)
    # checkpoint tensor suffix -> the model's parts it is cut into, in row order
    fused_projections: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Q/K stored for RoPE over adjacent pairs (ERNIE 4.5): rows permuted at load into
    # rotate-half order, which leaves q . k unchanged (weights/names.py)
    interleaved_rope: bool = False
    # tensors of layers past num_hidden_layers (GLM-4's MTP layers) are not read
    extra_layers_ignored: bool = False
    tensor_parallel: bool = False  # parallel/tp.py shards its layers
    native_decode: bool = False  # kernels/decode_stack.py was written for its layer


FAMILIES: dict[str, Family] = {f.architecture: f for f in (
    Family("llama", frozenset({"attention_bias", "mlp_bias"}), tensor_parallel=True, native_decode=True),
    Family("mistral", frozenset({"sliding_window"}), tensor_parallel=True, native_decode=True),
    Family("qwen2", _QWEN2_WINDOW, tensor_parallel=True, native_decode=True),
    Family("mixtral", frozenset({"sliding_window", "num_local_experts", "num_experts_per_tok"}),
           tensor_parallel=True),
    Family("phi3", frozenset({"sliding_window", "original_max_position_embeddings"}),
           fused_projections=_PHI3_FUSED, tensor_parallel=True, native_decode=True),
    Family("olmoe", frozenset({"attention_bias", "num_experts", "num_experts_per_tok", "norm_topk_prob",
                               "clip_qkv"}), routed_moe=True),
    Family("qwen2_moe", _QWEN2_WINDOW | {"num_experts", "num_experts_per_tok", "norm_topk_prob",
                                         "moe_intermediate_size", "shared_expert_intermediate_size",
                                         "decoder_sparse_step", "mlp_only_layers", "qkv_bias"},
           routed_moe=True),
    # Gemma 2 and Gemma 3 text (bidirectional attention is refused)
    Family("gemma2", frozenset({"attention_bias", "hidden_activation", "query_pre_attn_scalar", "layer_types",
                                "sliding_window", "attn_logit_softcapping", "final_logit_softcapping",
                                "use_bidirectional_attention"})),
    Family("gemma3_text", frozenset({"attention_bias", "hidden_activation", "query_pre_attn_scalar", "layer_types",
                                     "sliding_window", "_sliding_window_pattern", "sliding_window_pattern",
                                     "attn_logit_softcapping", "final_logit_softcapping", "rope_local_base_freq",
                                     "use_bidirectional_attention"})),
    # Qwen3: per-head QK RMSNorm before RoPE, attention_bias on all four projections
    Family("qwen3", _QWEN2_WINDOW | {"attention_bias"}),
    # Qwen3-MoE: Qwen3's attention, softmax top-k experts, no shared expert. NOTE:
    # max_window_layers, which Qwen3-MoE checkpoints carry, is read by no part of
    # transformers' model (every layer slides with use_sliding_window)
    Family("qwen3_moe", frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "attention_bias",
                                   "num_experts", "num_local_experts", "num_experts_per_tok", "norm_topk_prob",
                                   "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers"}),
           routed_moe=True),
    # SmolLM3: RoPE skipped on the layers no_rope_layers marks 0. NOTE: max_window_layers, a
    # Qwen2 field some SmolLM3 configs repeat, is read by no part of transformers' SmolLM3
    Family("smollm3", frozenset({"attention_bias", "mlp_bias", "use_sliding_window", "sliding_window",
                                 "no_rope_layers", "no_rope_layer_interval", "layer_types", "max_window_layers"})),
    # Granite: embedding, attention, residual and logit multipliers
    Family("granite", frozenset({"attention_bias", "mlp_bias", "embedding_multiplier", "attention_multiplier",
                                 "residual_multiplier", "logits_scaling"})),
    # OLMo 2: norms after attention and after the MLP (none before), QK-norm over all heads
    Family("olmo2", frozenset({"attention_bias"})),
    # ERNIE 4.5 (dense): use_bias on every projection, RoPE over adjacent pairs; once its
    # Q/K rows are reordered at load its layer is Llama's, which the native step runs
    Family("ernie4_5", frozenset({"use_bias"}), interleaved_rope=True, native_decode=True),
    # GLM-4 MoE: partial rotary, sigmoid router with a correction bias over expert groups,
    # shared experts, dense first layers. Its checkpoints' multi-token-prediction layers
    # (num_nextn_predict_layers, past num_hidden_layers) serve speculative decoding only:
    # transformers does not load them either
    Family("glm4_moe", frozenset({"attention_bias", "partial_rotary_factor", "moe_intermediate_size",
                                  "num_experts_per_tok", "n_shared_experts", "n_routed_experts",
                                  "routed_scaling_factor", "n_group", "topk_group", "first_k_dense_replace",
                                  "norm_topk_prob", "use_qk_norm", "num_nextn_predict_layers"}),
           routed_moe=True, extra_layers_ignored=True),
    # gpt-oss (float and bf16 weights): attention sinks, sliding and full layers alternating,
    # biases on Q/K/V/O and the router, top-k softmax routing, the clamped SwiGLU, YaRN
    Family("gpt_oss", frozenset({"attention_bias", "layer_types", "sliding_window", "num_local_experts",
                                 "num_experts_per_tok", "swiglu_alpha", "swiglu_limit"}), routed_moe=True),
    # ---- families2: Llama 4 text ----
    # Llama 4 text: MoE and dense layers interleaved (moe_layers / interleave_moe_layer_step),
    # top-k sigmoid router on pre-scaled inputs plus a shared expert, NoPE layers with
    # attention temperature tuning, chunked local attention on the RoPE layers, QK L2-norm
    # after RoPE; RoPE over adjacent pairs (Q/K rows reordered at load); FFNs under
    # ``feed_forward`` as its checkpoints name them (hf_config_llama4.py reads the fields)
    Family("llama4_text", frozenset({"attention_bias", "intermediate_size_mlp", "num_local_experts",
                                     "num_experts_per_tok", "moe_layers", "interleave_moe_layer_step",
                                     "use_qk_norm", "no_rope_layers", "no_rope_layer_interval",
                                     "attention_chunk_size", "layer_types", "attn_temperature_tuning",
                                     "floor_scale", "attn_scale"}),
           routed_moe=True, interleaved_rope=True),
    # ---- end families2 ----
)}


def family(architecture: str) -> Family | None:
    """The entry of ``architecture``, or None when inferpath does not implement it."""
    return FAMILIES.get(architecture)


# ------------------------------------------------------------------ native decode

def _any(value: Any, config: Any) -> bool:
    return True


def _equals(expected: Any) -> Callable[[Any, Any], bool]:
    return lambda value, config: value == expected


def _one_window(value: Any, config: Any) -> bool:
    """Every layer has the same sliding window (the native step runs one plan)."""
    return len({config.layer_window(i) for i in range(config.num_layers)}) == 1


# ModelConfig field -> does the native step implement this value (given the whole config)?
# Shapes are any value here; the kernels' own limits (head_dim, group size) are checked
# by decode_stack.py against the kernel they call.
NATIVE_DECODE_FIELDS: dict[str, Callable[[Any, Any], bool]] = {
    "architecture": lambda value, config: bool(FAMILIES.get(value) and FAMILIES[value].native_decode),
    **dict.fromkeys(("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "name"), _any),
    # RoPE: the cos/sin rows come from the model's own table (any scaling, one per model)
    "rope_theta": _any, "rope_scaling": _any,
    "local_rope_theta": _equals(None), "local_rope_scaling": _equals(None),
    # outside the layers: the embedding lookup and the LM head run in PyTorch
    "tie_word_embeddings": _any, "final_logit_softcapping": _any, "logits_scaling": _any,
    # each weight group carries its biases (decode.c weight_group)
    "attention_bias": _any, "o_proj_bias": _any, "mlp_bias": _any,
    "hidden_act": _equals("silu"),
    # experts: none (the MoE-only fields mean nothing without them)
    "num_experts": _equals(0),
    **dict.fromkeys(("num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                     "shared_expert_intermediate_size", "dense_layers", "moe_router", "num_expert_groups",
                     "num_topk_groups", "routed_scaling_factor", "swiglu_limit", "swiglu_alpha"), _any),
    # DeepSeek's router (MoE-only as above)
    **dict.fromkeys(("num_shared_experts", "router_scoring", "router_correction_bias", "n_group", "topk_group"),
                    _any),
    "attention_sinks": _equals(False),
    # latent attention (MLA) and Gated DeltaNet layers: none
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                     "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                     "linear_value_head_dim", "linear_conv_kernel_dim"), _equals(0)),
    "attn_output_gate": _equals(False), "partial_rotary_factor": _equals(1.0), "rope_interleave": _equals(False),
    "linear_split_projections": _equals(False),
    # the native RoPE turns whole heads
    "rotary_dim": lambda value, config: value in (0, config.head_dim),
    "qk_norm": _equals(""), "norm_weight_offset": _equals(0.0), "sandwich_norms": _equals(False),
    "post_norms": _equals(False), "embedding_multiplier": _equals(1.0), "residual_multiplier": _equals(1.0),
    # the step's plan carries the attention scale, whatever sets it
    "query_pre_attn_scalar": _any, "attention_multiplier": _any,
    "attn_logit_softcapping": _equals(None),
    "sliding_window": _any, "layer_types": _one_window,
    "no_rope_layers": _equals(()),
    # Llama 4's chunked attention and NoPE temperature: none
    "attention_chunk_size": _equals(0), "attn_temperature_floor": _equals(0), "attn_temperature_scale": _equals(0.0),
}


def native_decode_refusal(config: Any) -> str:
    """Why the native decode step may not run a model of ``config`` ('' if it may).

    ``config`` is a ModelConfig; every one of its fields must be listed in
    ``NATIVE_DECODE_FIELDS`` with a value the step implements.
    """
    entry = FAMILIES.get(config.architecture)
    if entry is None or not entry.native_decode:
        return f"the native decode step is not written for {config.architecture!r} models"
    for f in fields(config):
        check = NATIVE_DECODE_FIELDS.get(f.name)
        value = getattr(config, f.name)
        if check is None:
            return f"config field {f.name!r} (= {value!r}) is not on the native decode step's list"
        if not check(value, config):
            return f"the native decode step does not implement {f.name} = {value!r}"
    return ""
