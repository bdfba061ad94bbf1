"""Reading a Hugging Face ``config.json`` into ModelConfig, refusing what we do not implement.

Every field of the dict is accounted for: either the model reads it (``_MODEL_FIELDS`` and
the family's own fields, families.py), or it is known not to change the logits
(training-only settings, generation defaults, bookkeeping: ``HARMLESS_FIELDS``), or it is an
error naming it. A field that changes the math and is silently dropped gives a model that loads and
answers wrong, which is the one failure an inference engine must never have.

The same holds one level down for ``rope_scaling`` / ``rope_parameters``: each RoPE type
lists the keys it reads, and any other key is refused.
"""

from __future__ import annotations

from typing import Any

from inferpath.families import FAMILIES

# Settings that do not change a forward pass's logits: bookkeeping, training-only
# (dropout, router aux loss and jitter, initialisation), generation defaults (the engine's
# SamplingParams decide sampling), and pretraining_tp (a mathematically equivalent split of
# Llama's linears that transformers itself ignores at inference).
HARMLESS_FIELDS = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "dtype", "torch_dtype",
    "use_cache", "return_dict", "output_attentions", "output_hidden_states", "torchscript",
    "id2label", "label2id", "problem_type", "finetuning_task", "task_specific_params", "prefix",
    "tokenizer_class", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "initializer_range", "attention_dropout", "hidden_dropout",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
    "chunk_size_feed_forward", "pruned_heads", "tie_encoder_decoder", "tf_legacy_loss",
    "use_bfloat16", "pretraining_tp", "output_router_logits", "router_aux_loss_coef",
    "router_jitter_noise", "resid_pdrop", "embd_pdrop",
    # generation defaults
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens",
})
_MODEL_FIELDS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "max_position_embeddings", "tie_word_embeddings", "hidden_act",
})
# families whose attention_bias puts a bias on o_proj too (Qwen2's family only on Q, K, V)
_O_PROJ_BIASED = frozenset({"llama", "olmoe", "gemma2", "gemma3_text", "qwen3", "qwen3_moe", "smollm3", "granite",
                            "olmo2", "gpt_oss"})
# RMSNorm on Q and K before RoPE: over all heads at once, or over each head
_QK_NORMS = {"olmoe": "projection", "olmo2": "projection", "gemma3_text": "head", "qwen3": "head",
             "qwen3_moe": "head"}
SUPPORTED_ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh")
# RoPE type -> the keys of its parameters that the model reads (rope.py)
ROPE_KEYS = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                       "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
    # transformers' dynamic NTK scales against max_position_embeddings; the original length
    # some configs repeat here is not read by it either
    "dynamic": frozenset({"factor", "original_max_position_embeddings"}),
    "longrope": frozenset({"factor", "long_factor", "short_factor", "attention_factor",
                           "original_max_position_embeddings"}),
}


class UnsupportedFieldError(ValueError):
    """A config field (or value) changes the model's math and inferpath does not implement it."""


def check_fields(cfg: dict[str, Any], architecture: str) -> None:
    """Raise UnsupportedFieldError naming the first field neither read nor known harmless."""
    entry = FAMILIES.get(architecture)
    known = HARMLESS_FIELDS | _MODEL_FIELDS | (entry.config_fields if entry else frozenset())
    unknown = sorted(k for k in cfg if k not in known)
    if unknown:
        raise UnsupportedFieldError(
            f"config field {unknown[0]!r} (= {cfg[unknown[0]]!r}) is not implemented for "
            f"{architecture!r} models and may change the logits; refusing rather than "
            f"answering wrong" + (f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else "")
        )
    if architecture == "gemma3_text" and cfg.get("attn_logit_softcapping"):
        # transformers' Gemma 3 keeps the field but never applies it: no reference to match
        raise UnsupportedFieldError(f"attn_logit_softcapping = {cfg['attn_logit_softcapping']!r} is not "
                                    "implemented for Gemma 3 (only Gemma 2 soft-caps attention scores)")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedFieldError(f"use_bidirectional_attention = {cfg['use_bidirectional_attention']!r} "
                                    "is not implemented (attention is causal)")
    if cfg.get("clip_qkv") is not None:
        raise UnsupportedFieldError(f"clip_qkv = {cfg['clip_qkv']!r} is not implemented (only None)")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act", "silu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise UnsupportedFieldError(f"hidden_act {act!r} is not supported; supported: "
                                    f"{', '.join(SUPPORTED_ACTIVATIONS)}")


def rope_settings(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling or None) from either the old or the transformers 5 layout."""
    scaling = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if isinstance(cfg.get("rope_parameters"), dict):  # transformers >= 5 nests them
        params = dict(cfg["rope_parameters"])
        nested_theta = params.pop("rope_theta", None)
        theta = theta if theta is not None else nested_theta
        if params.get("partial_rotary_factor") == 1.0:  # explicit "rotate all of head_dim"
            del params["partial_rotary_factor"]
        if scaling is None and params.get("rope_type", params.get("type", "default")) != "default":
            scaling = params
        elif scaling is None:
            _check_rope_keys(params)
    if scaling is not None:
        _check_rope_keys(scaling)
        if _rope_type(scaling) == "default":
            scaling = None
        elif "original_max_position_embeddings" not in scaling and "original_max_position_embeddings" in cfg:
            # Phi-3 keeps it beside rope_scaling, not inside
            scaling = dict(scaling, original_max_position_embeddings=cfg["original_max_position_embeddings"])
    return float(theta if theta is not None else 10000.0), scaling


def _rope_type(scaling: dict[str, Any]) -> str:
    return scaling.get("rope_type", scaling.get("type", "default"))


def _check_rope_keys(scaling: dict[str, Any]) -> None:
    rope_type = _rope_type(scaling)
    if rope_type not in ROPE_KEYS:
        raise UnsupportedFieldError(f"rope_scaling type {rope_type!r} is not supported; "
                                    f"supported: {', '.join(ROPE_KEYS)}")
    allowed = ROPE_KEYS[rope_type] | {"rope_type", "type", "rope_theta"}
    extra = sorted(k for k in scaling if k not in allowed)
    if extra:
        raise UnsupportedFieldError(f"rope_scaling key {extra[0]!r} (= {scaling[extra[0]]!r}) is not "
                                    f"implemented for rope type {rope_type!r}")


def layer_types(cfg: dict[str, Any], architecture: str, num_layers: int) -> tuple[str, ...] | None:
    """Per-layer "full_attention" / "sliding_attention", or None when no layer slides.

    Mistral and Mixtral slide on every layer when ``sliding_window`` is set; Qwen2 only with
    ``use_sliding_window``, on layers ``>= max_window_layers`` unless ``layer_types`` says.
    """
    window = cfg.get("sliding_window")
    if architecture in ("gemma2", "gpt_oss"):  # every other layer slides, the first one included
        types = cfg.get("layer_types") or [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
    elif architecture == "gemma3_text":
        types = cfg.get("layer_types")
        if types is None:
            pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
            types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]
    elif architecture in ("qwen2", "qwen2_moe", "qwen3"):
        if not cfg.get("use_sliding_window", False):
            window = None
        types = cfg.get("layer_types")
        if types is None and window is not None:
            first = int(cfg.get("max_window_layers", num_layers))
            types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    elif architecture == "qwen3_moe":  # every layer slides with use_sliding_window
        window = window if cfg.get("use_sliding_window", False) else None
        types = None if window is None else ["sliding_attention"] * num_layers
    elif architecture == "smollm3":  # sliding only with use_sliding_window, on the NoPE layers by default
        types = cfg.get("layer_types")
        if not cfg.get("use_sliding_window", False):
            if types is not None and "sliding_attention" in types:
                raise UnsupportedFieldError(f"layer_types {list(types)!r} has sliding layers but use_sliding_window "
                                            "is false (transformers' SmolLM3 then disagrees with itself)")
            window = None
        elif types is None and window is not None:
            rope = smollm3_rope_layers(cfg, num_layers)
            types = ["full_attention" if rope[i] else "sliding_attention" for i in range(num_layers)]
    else:
        types = None if window is None else ["sliding_attention"] * num_layers
    if types is None or window is None and "sliding_attention" not in types:
        return None
    types = tuple(types)
    if len(types) != num_layers or not set(types) <= {"full_attention", "sliding_attention"}:
        raise UnsupportedFieldError(f"layer_types {list(types)!r} must name 'full_attention' or "
                                    f"'sliding_attention' for each of the {num_layers} layers")
    if "sliding_attention" in types and not window:
        raise UnsupportedFieldError("layer_types has sliding layers but sliding_window is not set")
    return types if "sliding_attention" in types else None


def smollm3_rope_layers(cfg: dict[str, Any], num_layers: int) -> list[int]:
    """SmolLM3's per-layer 1 (RoPE) / 0 (none): ``no_rope_layers``, else every
    ``no_rope_layer_interval``-th layer without."""
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = int(cfg.get("no_rope_layer_interval", 4))
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(flags) != num_layers or not set(flags) <= {0, 1}:
        raise UnsupportedFieldError(f"no_rope_layers {list(flags)!r} must be a 0 or 1 for each of the "
                                    f"{num_layers} layers")
    return [int(f) for f in flags]


def glm4_partial_rotary(cfg: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """GLM-4's partial_rotary_factor (in rope_parameters, or beside it in older configs;
    transformers' default 0.5) as the rotated width, and the config without it."""
    params = dict(cfg.get("rope_parameters") or {})
    factor = float(params.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.5)))
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    rotary_dim = int(head_dim * factor)
    rest = {k: v for k, v in cfg.items() if k != "partial_rotary_factor"}
    if "rope_parameters" in cfg:
        rest["rope_parameters"] = params
    return rest, rotary_dim


def gemma3_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's two RoPEs: global layers' (rope_theta, rope_scaling), sliding layers'
    (local_rope_theta, local_rope_scaling), from the nested or the older flat layout."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        glob = rope_settings({"rope_parameters": params["full_attention"]})
        local = rope_settings({"rope_parameters": params.get("sliding_attention", params["full_attention"])})
    else:
        glob = rope_settings(cfg)
        local = (float(cfg.get("rope_local_base_freq", 10000.0)), None)
    return dict(rope_theta=glob[0], rope_scaling=glob[1], local_rope_theta=local[0], local_rope_scaling=local[1])


def model_config_kwargs(cfg: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig keyword arguments from a config.json dict (KeyError for a missing field)."""
    architecture = cfg["model_type"]
    if architecture in ("deepseek_v3", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):  # layers of several kinds
        from inferpath.hf_config_kinds import KWARGS

        return KWARGS[architecture](cfg)
    check_fields(cfg, architecture)
    gemma = architecture in ("gemma2", "gemma3_text")
    if gemma:
        cfg = dict(cfg, hidden_act=cfg.get("hidden_activation") or cfg.get("hidden_act", "gelu_pytorch_tanh"))
    num_heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    num_layers = int(cfg["num_hidden_layers"])
    glm = architecture == "glm4_moe"
    rotary_dim = 0
    if glm:  # partial rotary: read here, so that rope_settings refuses it for every other family
        cfg, rotary_dim = glm4_partial_rotary(cfg)
    rope = gemma3_rope(cfg) if architecture == "gemma3_text" else dict(zip(("rope_theta", "rope_scaling"), rope_settings(cfg)))
    num_experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    types = layer_types(cfg, architecture, num_layers)
    llama_bias = bool(cfg.get("attention_bias", architecture == "gpt_oss"))  # Llama and its kind: all four projections
    ernie_bias = architecture == "ernie4_5" and bool(cfg.get("use_bias", False))  # every projection
    dense_layers: tuple[int, ...] = ()
    if architecture in ("qwen2_moe", "qwen3_moe"):
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        only = set(cfg.get("mlp_only_layers") or ())
        dense_layers = tuple(i for i in range(num_layers) if i in only or (i + 1) % step)
    no_rope: tuple[int, ...] = ()
    if architecture == "smollm3":
        no_rope = tuple(i for i, flag in enumerate(smollm3_rope_layers(cfg, num_layers)) if not flag)
    if glm:
        dense_layers = tuple(range(min(int(cfg.get("first_k_dense_replace", 1)), num_layers)))
    granite = architecture == "granite"
    oss = architecture == "gpt_oss"
    kwargs = dict(
        architecture=architecture,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
        head_dim=int(cfg.get("head_dim") or hidden // num_heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        **rope,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        # Qwen2 always has a Q/K/V bias and no o_proj bias; Llama's attention_bias is all four
        attention_bias=(architecture == "qwen2" or llama_bias or ernie_bias
                        or (architecture == "qwen2_moe" and bool(cfg.get("qkv_bias", True)))),
        o_proj_bias=(architecture in _O_PROJ_BIASED and llama_bias) or ernie_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)) or ernie_bias,
        hidden_act=str(cfg.get("hidden_act", "silu")),
        num_experts=num_experts,
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0) if num_experts else 0,
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
        # transformers' default: off for OLMoE, Qwen2-MoE, Qwen3-MoE, on for GLM-4; Mixtral always renormalises
        norm_topk_prob=bool(cfg.get("norm_topk_prob", glm)) if num_experts and architecture != "mixtral" else True,
        shared_expert_intermediate_size=(int(cfg.get("moe_intermediate_size", 0)) * int(cfg.get("n_shared_experts", 1))
                                         if glm else int(cfg.get("shared_expert_intermediate_size") or 0)),
        dense_layers=dense_layers,
        qk_norm="head" if glm and cfg.get("use_qk_norm") else _QK_NORMS.get(architecture, ""),
        norm_weight_offset=1.0 if gemma else 0.0,
        sandwich_norms=gemma,
        embedding_multiplier=(float(cfg["hidden_size"]) ** 0.5 if gemma
                              else float(cfg.get("embedding_multiplier", 1.0)) if granite else 1.0),
        query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]) if gemma else None,
        final_logit_softcapping=float(cfg["final_logit_softcapping"]) if cfg.get("final_logit_softcapping") else None,
        attn_logit_softcapping=float(cfg["attn_logit_softcapping"]) if cfg.get("attn_logit_softcapping") else None,
        sliding_window=int(cfg["sliding_window"]) if types else None,
        layer_types=types,
        no_rope_layers=no_rope,
        post_norms=architecture == "olmo2",
        attention_multiplier=float(cfg.get("attention_multiplier", 1.0)) if granite else None,
        residual_multiplier=float(cfg.get("residual_multiplier", 1.0)) if granite else 1.0,
        logits_scaling=float(cfg.get("logits_scaling", 1.0)) if granite else 1.0,
        rotary_dim=rotary_dim,
        moe_router="sigmoid_grouped" if glm else "topk_softmax" if oss else "softmax",
        num_expert_groups=int(cfg.get("n_group", 1)) if glm else 1,
        num_topk_groups=int(cfg.get("topk_group", 1)) if glm else 1,
        routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)) if glm else 1.0,
        swiglu_limit=float(cfg.get("swiglu_limit", 7.0)) if oss else None,
        swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)) if oss else 1.0,
        attention_sinks=oss,
    )
    if architecture == "llama4_text":  # families2: Llama 4's own fields (hf_config_llama4.py)
        from inferpath.hf_config_llama4 import llama4_text_fields

        kwargs.update(llama4_text_fields(cfg, num_layers))
    return kwargs
