"""What each GGUF architecture means in Hugging Face terms (one entry per architecture).

llama.cpp names an architecture (``general.architecture``) and writes its hyperparameters
as ``{arch}.*`` keys. Some settings are not in the file at all: llama.cpp fixes them per
architecture when it loads the file (Gemma's sliding-window pattern, the local RoPE base,
the attention scale), so a reader must apply the same rules to run the same model. An
entry holds, for one architecture: the Hugging Face ``model_type``; whether the converter
permuted the Q/K rows (Llama's interleaved RoPE); tensor renames that differ from the Llama
table (names.py); the constant the converter added to norm weights; the ``{arch}.`` keys
read beyond the common ones (gguf_keys.py refuses any other); and a function giving the
architecture's own config.json fields from the metadata, with llama.cpp's defaults
(``vendor/llama.cpp/src/models/<arch>.cpp`` in llama-cpp-python 0.3.36) where a key is absent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferpath.weights import gguf_arch_more as more
from inferpath.weights.errors import WeightsError

Meta = Callable[..., Any]  # meta(key, default=None): the value of "{arch}.{key}"
# (meta, the common config.json fields, the file's tensor names -> shapes, path) -> own fields
ConfigFields = Callable[[Meta, dict[str, Any], Mapping[str, tuple[int, ...]], Path], dict[str, Any]]

# Gemma 2 and 3 (GGUF names -> Hugging Face per-layer names): four norms per layer and a
# per-head RMSNorm on Q and K (Gemma 3); llama.cpp's "ffn_norm" is the pre-FFN norm here,
# not Llama's post_attention_layernorm
_GEMMA_RENAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
# MoE families with experts under "mlp" in Llama names (OLMoE, Qwen2-MoE); the stacked
# ffn_*_exps tensors are named by names.stacked_expert_names
_ROUTED_RENAMES = {
    "ffn_gate_inp": "mlp.gate",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# Phi-3: Q, K, V in one matrix and gate, up in another, as in its Hugging Face checkpoint
# (names.FUSED_PROJECTIONS splits them); llama.cpp's "ffn_up" is the fused gate_up_proj
_PHI3_RENAMES = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}


@dataclass(frozen=True)
class GGUFArchitecture:
    """How one ``general.architecture`` maps onto a Hugging Face model.

    Invariant: ``keys`` lists every ``{arch}.`` key ``config_fields`` reads (they are
    accepted by gguf_keys.py only because something reads them).
    """

    model_type: str
    permuted_qk: bool = False
    renames: Mapping[str, str] = field(default_factory=dict)
    # the converter stored each "*norm.weight" as the Hugging Face weight + norm_shift
    norm_shift: float = 0.0
    keys: frozenset[str] = frozenset()
    config_fields: ConfigFields | None = None
    # stacked experts under mlp.experts.E.{gate,up,down}_proj, not Mixtral's block_sparse_moe
    routed_experts: bool = False
    # per-layer GGUF names (after "blk.N.") renamed whole, suffix included ("ssm_a" has none)
    exact_renames: Mapping[str, str] = field(default_factory=dict)
    # config_fields reads rope.dimension_count and value_length itself (partial rotary, MLA)
    own_head_dims: bool = False
    # per-layer GGUF kinds always read as float (``combine`` rebuilds them), and the function
    # that turns the converter's tensors back into Hugging Face's (gguf_arch_more.py)
    float_kinds: frozenset[str] = frozenset()
    combine: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
    # tensors of layers past num_hidden_layers (multi-token prediction) are not read
    extra_layers_ignored: bool = False
    # (tensors, config) -> tensors: the read tensors put into the checkpoint's layout
    # (stacked experts fused as the family stores them: gguf_stacked.py); None: as read
    regroup: Callable[[dict, Any], dict] | None = None


def sliding_layers(meta: Meta, num_layers: int, default_pattern: int, path: Path) -> list[bool]:
    """Which layers slide: ``attention.sliding_window_pattern`` as a per-layer list, or a
    period n (every n-th layer, the last of each period, attends fully; 0 = all slide), as
    llama.cpp's ``set_swa_pattern``; ``default_pattern`` when the key is absent."""
    pattern = meta("attention.sliding_window_pattern", default_pattern)
    if isinstance(pattern, list):
        if len(pattern) != num_layers:
            raise WeightsError(f"{path}: attention.sliding_window_pattern has {len(pattern)} entries "
                               f"for {num_layers} layers; the file is inconsistent")
        return [bool(p) for p in pattern]
    n = int(pattern)
    return [n == 0 or i % n < n - 1 for i in range(num_layers)]


def _gemma_query_scalar(hf: dict[str, Any], num_layers_27b: int) -> float:
    """llama.cpp's Gemma attention scale (the file has no key for it): the 27B model
    (told by its layer count) scales by (hidden / heads) ** -0.5, every other size by
    head_dim ** -0.5 (google/gemma_pytorch's config, as llama.cpp cites it)."""
    if hf["num_hidden_layers"] == num_layers_27b:
        return float(hf["hidden_size"] // hf["num_attention_heads"])
    return float(hf["head_dim"])


def _layer_types(sliding: list[bool]) -> list[str]:
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def _gemma3(meta: Meta, hf: dict[str, Any], tensors: Mapping[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """Gemma 3: sliding layers (period 6 by default) only when a window is given; their
    RoPE base ``rope.freq_base_swa`` or 10000, unscaled; no attention soft cap."""
    num_layers = hf["num_hidden_layers"]
    window = int(meta("attention.sliding_window", 0) or 0)
    sliding = sliding_layers(meta, num_layers, 6, path) if window > 0 else [False] * num_layers
    fields: dict[str, Any] = {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": _gemma_query_scalar(hf, 62),
        "layer_types": _layer_types(sliding),
        "sliding_window": window if any(sliding) else None,
        "rope_local_base_freq": float(meta("rope.freq_base_swa", 10000.0)),
    }
    if cap := meta("final_logit_softcapping"):
        fields["final_logit_softcapping"] = float(cap)
    return fields


def _gemma2(meta: Meta, hf: dict[str, Any], tensors: Mapping[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """Gemma 2: every other layer slides (the first included), window 4096 and soft caps
    50 (attention) / 30 (logits) unless the file says; one RoPE base for all layers."""
    num_layers = hf["num_hidden_layers"]
    swa_base = meta("rope.freq_base_swa")
    if swa_base is not None and float(swa_base) != hf["rope_theta"]:
        raise WeightsError(f"{path}: gemma2.rope.freq_base_swa = {swa_base} differs from rope.freq_base "
                           f"= {hf['rope_theta']}; a separate RoPE base for Gemma 2's sliding layers "
                           "is not implemented")
    window = int(meta("attention.sliding_window", 4096) or 0)
    sliding = sliding_layers(meta, num_layers, 2, path) if window > 0 else [False] * num_layers
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": _gemma_query_scalar(hf, 46),
        "layer_types": _layer_types(sliding),
        "sliding_window": window if any(sliding) else None,
        "attn_logit_softcapping": float(meta("attn_logit_softcapping", 50.0)) or None,
        "final_logit_softcapping": float(meta("final_logit_softcapping", 30.0)) or None,
    }


def _phi3(meta: Meta, hf: dict[str, Any], tensors: Mapping[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """Phi-3: a window of 0 means none (Phi-4). NOTE: llama.cpp 0.3.36 ignores a positive
    window (it warns and attends fully); we keep it, as transformers and the model's own
    config.json do, so the file runs the model it was converted from."""
    window = int(meta("attention.sliding_window", 0) or 0)
    return {"sliding_window": window or None}


def _moe_layers(tensors: Mapping[str, tuple[int, ...]], num_layers: int) -> list[int]:
    """The layers with a router (``blk.N.ffn_gate_inp``): the others are dense MLPs."""
    return [i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" in tensors]


def _olmoe(meta: Meta, hf: dict[str, Any], tensors: Mapping[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """OLMoE: softmax routing, top-k weights not renormalised (llama.cpp's olmoe graph has
    no key for it); biases on all four attention projections or none."""
    return {"num_experts": int(meta("expert_count")), "num_experts_per_tok": int(meta("expert_used_count")),
            "norm_topk_prob": False, "attention_bias": "blk.0.attn_q.bias" in tensors, "clip_qkv": None}


def _qwen2moe(meta: Meta, hf: dict[str, Any], tensors: Mapping[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """Qwen2-MoE: experts of ``expert_feed_forward_length``, a shared expert of
    ``expert_shared_feed_forward_length`` behind a sigmoid gate, top-k not renormalised;
    layers without a router are dense MLPs of ``feed_forward_length``."""
    num_layers = hf["num_hidden_layers"]
    moe = set(_moe_layers(tensors, num_layers))
    return {"intermediate_size": int(meta("feed_forward_length")),
            "moe_intermediate_size": int(meta("expert_feed_forward_length")),
            "shared_expert_intermediate_size": int(meta("expert_shared_feed_forward_length", 0) or 0),
            "num_experts": int(meta("expert_count")), "num_experts_per_tok": int(meta("expert_used_count")),
            "norm_topk_prob": False, "qkv_bias": "blk.0.attn_q.bias" in tensors,
            "mlp_only_layers": [i for i in range(num_layers) if i not in moe]}


def _qwen3(meta: Meta, hf: dict[str, Any], tensors: Mapping[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """Qwen3: per-head QK RMSNorm (the tensors), attention biases only if the file has them."""
    return {"attention_bias": "blk.0.attn_q.bias" in tensors}


def _qwen3moe(meta: Meta, hf: dict[str, Any], tensors: Mapping[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """Qwen3-MoE: top-k weights renormalised (llama.cpp's qwen3moe graph always does, so the
    file has no key for it); layers without a router are dense MLPs of feed_forward_length."""
    num_layers = hf["num_hidden_layers"]
    moe = set(_moe_layers(tensors, num_layers))
    return {"intermediate_size": int(meta("feed_forward_length")),
            "moe_intermediate_size": int(meta("expert_feed_forward_length")),
            "num_experts": int(meta("expert_count")), "num_experts_per_tok": int(meta("expert_used_count")),
            "norm_topk_prob": True, "attention_bias": "blk.0.attn_q.bias" in tensors,
            "mlp_only_layers": [i for i in range(num_layers) if i not in moe]}


def _granite(meta: Meta, hf: dict[str, Any], tensors: Mapping[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """Granite's four multipliers, as llama.cpp's granite graph reads them: ``logit_scale``
    required (logits divided by it), an absent or zero embedding / residual scale is 1, an
    absent or zero attention scale is head_dim ** -0.5."""
    if (logit_scale := meta("logit_scale")) is None:
        raise WeightsError(f"{path}: GGUF metadata lacks 'granite.logit_scale', which Granite needs")
    return {"embedding_multiplier": float(meta("embedding_scale", 0.0) or 1.0),
            "residual_multiplier": float(meta("residual_scale", 0.0) or 1.0),
            "attention_multiplier": float(meta("attention.scale", 0.0) or hf["head_dim"] ** -0.5),
            "logits_scaling": float(logit_scale),
            "attention_bias": "blk.0.attn_q.bias" in tensors, "mlp_bias": "blk.0.ffn_up.bias" in tensors}


def _olmo2(meta: Meta, hf: dict[str, Any], tensors: Mapping[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """OLMo 2: norms after attention and after the MLP only, QK-norm over all heads."""
    return {"attention_bias": "blk.0.attn_q.bias" in tensors}


GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    # llama.cpp stores Mixtral as "llama" with an expert count, and Mistral 7B as "llama" too
    "llama": GGUFArchitecture("llama", permuted_qk=True),
    "mistral": GGUFArchitecture("mistral", permuted_qk=True),
    "qwen2": GGUFArchitecture("qwen2"),
    "gemma3": GGUFArchitecture(
        "gemma3_text", renames=_GEMMA_RENAMES, norm_shift=1.0, config_fields=_gemma3,
        keys=frozenset({"final_logit_softcapping", "rope.freq_base_swa", "attention.sliding_window_pattern"})),
    "gemma2": GGUFArchitecture(
        "gemma2", renames=_GEMMA_RENAMES, norm_shift=1.0, config_fields=_gemma2,
        keys=frozenset({"final_logit_softcapping", "attn_logit_softcapping", "rope.freq_base_swa",
                        "attention.sliding_window_pattern"})),
    "phi3": GGUFArchitecture("phi3", renames=_PHI3_RENAMES, config_fields=_phi3),
    "olmoe": GGUFArchitecture("olmoe", renames=_ROUTED_RENAMES, config_fields=_olmoe, routed_experts=True),
    "qwen2moe": GGUFArchitecture("qwen2_moe", renames=_ROUTED_RENAMES, config_fields=_qwen2moe,
                                 routed_experts=True, keys=frozenset({"expert_shared_feed_forward_length"})),
    "qwen3": GGUFArchitecture("qwen3", renames={"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
                              config_fields=_qwen3),
    "qwen3moe": GGUFArchitecture("qwen3_moe", renames=_ROUTED_RENAMES, config_fields=_qwen3moe, routed_experts=True),
    "olmo2": GGUFArchitecture("olmo2", config_fields=_olmo2, renames={
        "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
        "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}),
    # the converter's Granite is its Llama: Q/K rows permuted
    "granite": GGUFArchitecture("granite", permuted_qk=True, config_fields=_granite, keys=frozenset({
        "attention.scale", "embedding_scale", "residual_scale", "logit_scale"})),
    # ---- SmolLM3, ERNIE 4.5, GLM-4 MoE, DeepSeek-V2/V3, Qwen3-Next (gguf_arch_more.py)
    # SmolLM3 is converted as Llama (Q/K permuted); ERNIE 4.5 is not, but its checkpoint
    # stores Q/K for RoPE over adjacent pairs, which is the same row order
    "smollm3": GGUFArchitecture("smollm3", permuted_qk=True, config_fields=more.smollm3),
    "ernie4_5": GGUFArchitecture("ernie4_5", permuted_qk=True, config_fields=more.ernie4_5),
    "glm4moe": GGUFArchitecture(
        "glm4_moe", routed_experts=True, own_head_dims=True, extra_layers_ignored=True, config_fields=more.glm4moe,
        renames={**_ROUTED_RENAMES, "post_attention_norm": "post_attention_layernorm",
                 "ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
                 "ffn_down_shexp": "mlp.shared_experts.down_proj"},
        exact_renames={"exp_probs_b.bias": "mlp.gate.e_score_correction_bias"},
        keys=frozenset({"expert_shared_count", "leading_dense_block_count", "expert_gating_func",
                        "expert_weights_scale", "expert_weights_norm", "expert_group_count",
                        "expert_group_used_count", "nextn_predict_layers"})),
    "deepseek2": GGUFArchitecture(
        "deepseek_v3", routed_experts=True, own_head_dims=True, config_fields=more.deepseek2,
        combine=more.combine_deepseek2, float_kinds=frozenset({"attn_k_b", "attn_v_b"}),
        renames={"attn_q_a": "self_attn.q_a_proj", "attn_q_a_norm": "self_attn.q_a_layernorm",
                 "attn_q_b": "self_attn.q_b_proj", "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
                 "attn_kv_a_norm": "self_attn.kv_a_layernorm", "attn_k_b": "self_attn.k_b_proj",
                 "attn_v_b": "self_attn.v_b_proj", "ffn_gate_inp": "mlp.gate",
                 "ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
                 "ffn_down_shexp": "mlp.shared_experts.down_proj"},
        exact_renames={"exp_probs_b.bias": "mlp.gate.e_score_correction_bias"},
        keys=frozenset({"rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
                        "attention.q_lora_rank", "attention.kv_lora_rank", "attention.key_length_mla",
                        "attention.value_length_mla", "leading_dense_block_count", "expert_shared_count",
                        "expert_weights_scale", "expert_weights_norm", "expert_gating_func",
                        "expert_group_count", "expert_group_used_count"})),
    "qwen3next": GGUFArchitecture(
        "qwen3_next", routed_experts=True, own_head_dims=True, config_fields=more.qwen3next,
        combine=more.combine_qwen3next, float_kinds=frozenset({"attn_qkv", "attn_gate"}),
        renames={**_ROUTED_RENAMES, "post_attention_norm": "post_attention_layernorm",
                 "attn_qkv": "linear_attn.in_proj_qkv", "attn_gate": "linear_attn.in_proj_z",
                 "ssm_ba": "linear_attn.in_proj_ba", "ssm_norm": "linear_attn.norm",
                 "ssm_out": "linear_attn.out_proj"},
        exact_renames={"ssm_a": "linear_attn.ssm_a", "ssm_dt.bias": "linear_attn.dt_bias",
                       "ssm_conv1d.weight": "linear_attn.conv1d.weight"},
        keys=frozenset({"expert_shared_feed_forward_length", "ssm.conv_kernel", "ssm.state_size",
                        "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
                        "attention.recurrent_layers", "full_attention_interval"})),
    # ---- end of SmolLM3 .. Qwen3-Next
}


# ---- families2: Llama 4 text and gpt-oss (weights/gguf_stacked.py) ----
from inferpath.weights import gguf_stacked as _stacked  # noqa: E402

GGUF_ARCHITECTURES.update({
    "llama4": GGUFArchitecture("llama4_text", renames=_stacked.LLAMA4_RENAMES, config_fields=_stacked.llama4_fields,
                               regroup=_stacked.regroup_llama4, keys=frozenset({"interleave_moe_layer_step"})),
    "gpt-oss": GGUFArchitecture("gpt_oss", renames=_stacked.GPT_OSS_RENAMES, config_fields=_stacked.gpt_oss_fields,
                                regroup=_stacked.regroup_gpt_oss,
                                keys=frozenset({"rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow"})),
})
# ---- end families2 ----


def is_norm(gguf_tensor: str) -> bool:
    """A norm weight, as the converters tell them (the name ends in "norm.weight")."""
    return gguf_tensor.endswith("norm.weight")
