"""``config.json`` of DeepSeek-V3 (latent attention, DeepSeek MoE) and Qwen3-Next (hybrid
linear attention) into ModelConfig keyword arguments, refusing what is not understood.

The same contract as hf_config.py: every field is read, known harmless, or an error naming
it. Both run in the engine: DeepSeek-V3 in model/mla.py and model/deepseek_moe.py, Qwen3-Next
in model/gated_deltanet.py and model/qwen3_next.py.
"""

from __future__ import annotations

from typing import Any

from inferpath.hf_config import HARMLESS_FIELDS, UnsupportedFieldError, rope_settings

_COMMON = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
    "max_position_embeddings", "tie_word_embeddings", "hidden_act", "attention_bias",
    "num_experts_per_tok", "norm_topk_prob", "moe_intermediate_size",
})
FIELDS = {
    # transformers 5.24 DeepseekV3Config and the published config.json (scoring_func,
    # topk_method, moe_layer_freq); num_nextn_predict_layers is the multi-token-prediction
    # module, a drafter the plain forward pass never runs; ep_size, aux_loss_alpha and
    # seq_aux are training or deployment settings
    "deepseek_v3": _COMMON | {
        "n_shared_experts", "n_routed_experts", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
        "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "qk_head_dim", "n_group", "topk_group",
        "first_k_dense_replace", "moe_layer_freq", "scoring_func", "topk_method", "rope_interleave",
        "num_nextn_predict_layers", "ep_size", "aux_loss_alpha", "seq_aux",
    },
    "qwen3_next": _COMMON | {
        "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
        "linear_num_value_heads", "decoder_sparse_step", "shared_expert_intermediate_size", "num_experts",
        "mlp_only_layers", "layer_types", "full_attention_interval", "partial_rotary_factor",
        "use_sliding_window", "sliding_window", "max_window_layers",
    },
}
# Qwen3.5's text-only checkpoints (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM): Qwen3-Next's
# fields; the dense one has no expert fields (transformers 5.24 deletes them from its config)
FIELDS["qwen3_5_moe_text"] = FIELDS["qwen3_next"]
FIELDS["qwen3_5_text"] = FIELDS["qwen3_next"] - {
    "num_experts_per_tok", "norm_topk_prob", "moe_intermediate_size", "decoder_sparse_step",
    "shared_expert_intermediate_size", "num_experts", "mlp_only_layers"}
# rope_parameters keys of Qwen3.5's multimodal RoPE: with text only, the three position
# components (time, height, width) are the same token index, and the interleaved sections
# then rotate exactly as one plain RoPE (transformers' text path builds them so)
MROPE_KEYS = ("mrope_section", "mrope_interleaved")
TOPK_METHODS = {"noaux_tc": True, "greedy": False, "group_limited_greedy": False}  # -> correction bias


def check_kind_fields(cfg: dict[str, Any], architecture: str) -> None:
    known = HARMLESS_FIELDS | FIELDS[architecture]
    unknown = sorted(k for k in cfg if k not in known)
    if unknown:
        raise UnsupportedFieldError(
            f"config field {unknown[0]!r} (= {cfg[unknown[0]]!r}) is not implemented for {architecture!r} "
            "models and may change the logits; refusing rather than answering wrong"
            + (f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""))
    if cfg.get("attention_bias"):
        raise UnsupportedFieldError(f"attention_bias = {cfg['attention_bias']!r} is not implemented for "
                                    f"{architecture!r} (only False)")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedFieldError(f"hidden_act {act!r} is not supported for {architecture!r} (silu only)")


def _base(cfg: dict[str, Any], architecture: str, rope: tuple[float, dict | None]) -> dict[str, Any]:
    num_heads = int(cfg["num_attention_heads"])
    return dict(
        architecture=architecture, vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]), num_layers=int(cfg["num_hidden_layers"]),
        num_heads=num_heads, num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=rope[0], rope_scaling=rope[1],
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0),
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
    )


def deepseek_v3_kwargs(cfg: dict[str, Any]) -> dict[str, Any]:
    check_kind_fields(cfg, "deepseek_v3")
    num_layers = int(cfg["num_hidden_layers"])
    nope, rope_dim = int(cfg.get("qk_nope_head_dim", 128)), int(cfg.get("qk_rope_head_dim", 64))
    if "qk_head_dim" in cfg and int(cfg["qk_head_dim"]) != nope + rope_dim:
        raise UnsupportedFieldError(f"qk_head_dim = {cfg['qk_head_dim']!r} is not qk_nope_head_dim + "
                                    f"qk_rope_head_dim = {nope + rope_dim}")
    if int(cfg.get("moe_layer_freq", 1)) != 1:
        raise UnsupportedFieldError(f"moe_layer_freq = {cfg['moe_layer_freq']!r} is not implemented (only 1)")
    method = cfg.get("topk_method", "noaux_tc")  # transformers' DeepSeek-V3 always corrects
    if method not in TOPK_METHODS:
        raise UnsupportedFieldError(f"topk_method {method!r} is not one of {', '.join(TOPK_METHODS)}")
    experts = int(cfg.get("n_routed_experts") or 0)
    kwargs = _base(cfg, "deepseek_v3", rope_settings(cfg))
    kwargs.update(
        head_dim=nope + rope_dim, num_experts=experts,
        num_experts_per_tok=kwargs["num_experts_per_tok"] if experts else 0,
        dense_layers=tuple(range(min(int(cfg.get("first_k_dense_replace", 0)), num_layers))) if experts else (),
        kv_lora_rank=int(cfg["kv_lora_rank"]), q_lora_rank=int(cfg.get("q_lora_rank") or 0),
        qk_nope_head_dim=nope, qk_rope_head_dim=rope_dim, v_head_dim=int(cfg.get("v_head_dim", 128)),
        num_shared_experts=int(cfg.get("n_shared_experts") or 0),
        router_scoring=str(cfg.get("scoring_func", "sigmoid")), router_correction_bias=TOPK_METHODS[method],
        n_group=int(cfg.get("n_group") or 1), topk_group=int(cfg.get("topk_group") or 1),
        routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
        rope_interleave=bool(cfg.get("rope_interleave", True)),  # transformers' default; V3's file omits it
    )
    return kwargs


def qwen3_next_kwargs(cfg: dict[str, Any], architecture: str = "qwen3_next") -> dict[str, Any]:
    """Qwen3-Next, or Qwen3.5 (``architecture`` qwen3_5_text / qwen3_5_moe_text: the same
    layers, the Gated DeltaNet's projections stored apart, MRoPE keys that text reduces to RoPE)."""
    check_kind_fields(cfg, architecture)
    qwen3_5 = architecture != "qwen3_next"
    if cfg.get("use_sliding_window"):
        raise UnsupportedFieldError("use_sliding_window = True is not implemented for 'qwen3_next'")
    num_layers = int(cfg["num_hidden_layers"])
    rope_cfg = dict(cfg)
    partial = cfg.get("partial_rotary_factor")
    if isinstance(cfg.get("rope_parameters"), dict):
        params = dict(cfg["rope_parameters"])
        partial = params.pop("partial_rotary_factor", partial)
        if qwen3_5:
            for key in MROPE_KEYS:
                params.pop(key, None)
        rope_cfg["rope_parameters"] = params
    types = cfg.get("layer_types")
    if types is None:
        interval = int(cfg.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    if len(types) != num_layers or not set(types) <= {"full_attention", "linear_attention"}:
        raise UnsupportedFieldError(f"layer_types {list(types)!r} must name 'full_attention' or "
                                    f"'linear_attention' for each of the {num_layers} layers")
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    only = set(cfg.get("mlp_only_layers") or ())
    experts = int(cfg.get("num_experts") or 0)
    kwargs = _base(cfg, architecture, rope_settings(rope_cfg))
    kwargs.update(
        head_dim=int(cfg.get("head_dim") or kwargs["hidden_size"] // kwargs["num_heads"]), num_experts=experts,
        num_experts_per_tok=kwargs["num_experts_per_tok"] if experts else 0,
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
        dense_layers=tuple(i for i in range(num_layers) if i in only or (i + 1) % step) if experts else (),
        qk_norm="head", norm_weight_offset=1.0,  # Qwen3-Next's norms multiply by 1 + w
        layer_types=tuple(types), attn_output_gate=True,
        partial_rotary_factor=float(partial if partial is not None else 1.0),
        linear_num_key_heads=int(cfg["linear_num_key_heads"]),
        linear_num_value_heads=int(cfg["linear_num_value_heads"]),
        linear_key_head_dim=int(cfg["linear_key_head_dim"]), linear_value_head_dim=int(cfg["linear_value_head_dim"]),
        linear_conv_kernel_dim=int(cfg["linear_conv_kernel_dim"]), linear_split_projections=qwen3_5,
    )
    return kwargs


KWARGS = {"deepseek_v3": deepseek_v3_kwargs, "qwen3_next": qwen3_next_kwargs,
          "qwen3_5_text": lambda cfg: qwen3_next_kwargs(cfg, "qwen3_5_text"),
          "qwen3_5_moe_text": lambda cfg: qwen3_next_kwargs(cfg, "qwen3_5_moe_text")}
