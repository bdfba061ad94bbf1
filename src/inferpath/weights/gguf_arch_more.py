"""GGUF rules of SmolLM3, ERNIE 4.5, GLM-4 MoE, DeepSeek-V2/V3 (``deepseek2``) and
Qwen3-Next (``qwen3next``): their config fields from the metadata, and for the last two the
tensors llama.cpp's converter (``convert_hf_to_gguf.py``, llama-cpp-python 0.3.36) rewrote,
put back into Hugging Face's form. The entries themselves are in gguf_arch.py.

What the converter changed, and what ``combine_*`` undoes:

- ``deepseek2``: ``kv_b_proj`` (H x (n + v), r) is written as ``attn_k_b`` (H, r, n), its
  key half transposed per head, and ``attn_v_b`` (H, v, r); both are joined back. The file
  calls MLA "MQA over latents" (head_count_kv 1, key_length r + p, value_length r); the
  per-head sizes are ``key_length_mla`` (n + p) and ``value_length_mla`` (v).
- ``qwen3next``: ``A_log`` is stored as ``ssm_a`` = -exp(A_log); ``dt_bias`` as
  ``ssm_dt.bias``; ``conv1d`` squeezed to (channels, kernel); every RMSNorm weight but the
  gated one (``ssm_norm``) as 1 + w; ``in_proj_qkvz``, which groups [q, k, v, z] per key
  head, as ``attn_qkv`` (all q, all k, all v) and ``attn_gate`` (all z), regrouped here.

Defaults where a key is absent follow llama.cpp's loaders (``src/models/<arch>.cpp``):
SmolLM3 skips RoPE on every 4th layer (``n_no_rope_layer_step = 4``, no key); a
``deepseek2`` file without ``expert_gating_func`` is run with softmax expert scores.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from inferpath.weights.errors import WeightsError

Shapes = Mapping[str, tuple[int, ...]]
SIGMOID_GATING = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (1 = softmax)


def _bias(tensors: Shapes, part: str) -> bool:
    return f"blk.0.{part}.bias" in tensors


def _refuse_rope_scaling(meta, path: Path, arch: str) -> None:
    if meta("rope.scaling.type") not in (None, "none"):
        raise WeightsError(f"{path}: {arch}.rope.scaling.type = {meta('rope.scaling.type')!r} is not "
                           f"implemented for {arch!r} files (no RoPE scaling)")


def smollm3(meta, hf: dict[str, Any], tensors: Shapes, path: Path) -> dict[str, Any]:
    """SmolLM3: no RoPE on layers 3, 7, 11, ... (llama.cpp's fixed step of 4); biases as the
    tensors say; the converter writes no sliding window."""
    return {"no_rope_layers": [int((i + 1) % 4 != 0) for i in range(hf["num_hidden_layers"])],
            "attention_bias": _bias(tensors, "attn_q"), "mlp_bias": _bias(tensors, "ffn_up")}


def ernie4_5(meta, hf: dict[str, Any], tensors: Shapes, path: Path) -> dict[str, Any]:
    """ERNIE 4.5 (dense): ``use_bias`` on every projection, or none."""
    return {"use_bias": _bias(tensors, "attn_q")}


def _rotary_factor(meta, head_dim: int, path: Path, arch: str) -> float:
    rot = int(meta("rope.dimension_count", head_dim))
    if not 0 < rot <= head_dim or rot % 2:
        raise WeightsError(f"{path}: {arch}.rope.dimension_count = {rot} must be an even number in "
                           f"1..{head_dim} (the head dimension)")
    return rot / head_dim


def glm4moe(meta, hf: dict[str, Any], tensors: Shapes, path: Path) -> dict[str, Any]:
    """GLM-4 MoE: the rotated part of each head, the sigmoid router over expert groups with
    its correction bias, shared experts, dense first layers; the multi-token-prediction
    layers (``nextn_predict_layers``, the last of ``block_count``) are not run."""
    _refuse_rope_scaling(meta, path, "glm4moe")
    if int(meta("expert_gating_func", SIGMOID_GATING)) != SIGMOID_GATING:
        raise WeightsError(f"{path}: glm4moe.expert_gating_func = {meta('expert_gating_func')} is not "
                           "implemented (GLM-4 MoE's router is sigmoid, 2)")
    nextn = int(meta("nextn_predict_layers", 0) or 0)
    layers = hf["num_hidden_layers"] - nextn
    return {"num_hidden_layers": layers, "num_nextn_predict_layers": nextn,
            "partial_rotary_factor": _rotary_factor(meta, hf["head_dim"], path, "glm4moe"),
            "intermediate_size": int(meta("feed_forward_length")),
            "moe_intermediate_size": int(meta("expert_feed_forward_length")),
            "n_routed_experts": int(meta("expert_count")), "num_experts_per_tok": int(meta("expert_used_count")),
            "n_shared_experts": int(meta("expert_shared_count", 0) or 0),
            "first_k_dense_replace": int(meta("leading_dense_block_count", 0) or 0),
            "n_group": int(meta("expert_group_count", 1) or 1), "topk_group": int(meta("expert_group_used_count", 1) or 1),
            "routed_scaling_factor": float(meta("expert_weights_scale", 1.0)),
            "norm_topk_prob": bool(meta("expert_weights_norm", False)),
            "use_qk_norm": "blk.0.attn_q_norm.weight" in tensors, "attention_bias": _bias(tensors, "attn_q")}


def deepseek2(meta, hf: dict[str, Any], tensors: Shapes, path: Path) -> dict[str, Any]:
    """DeepSeek-V2/V3: latent attention sizes from the ``*_mla`` and LoRA-rank keys, the
    router (sigmoid scores with a correction bias only), grouped top-k, shared experts."""
    rope_scaling = _deepseek2_yarn(meta, hf, path)
    gating = meta("expert_gating_func")
    if gating is None or int(gating) != SIGMOID_GATING:
        said = "absent (llama.cpp then uses softmax)" if gating is None else f"= {gating}"
        raise WeightsError(f"{path}: deepseek2.expert_gating_func {said}: softmax expert scores are not "
                           "implemented for DeepSeek models (only sigmoid, 2, as DeepSeek-V3's scoring_func)")
    for key in ("attention.kv_lora_rank", "attention.key_length_mla", "attention.value_length_mla",
                "rope.dimension_count"):
        if meta(key) is None:
            raise WeightsError(f"{path}: GGUF metadata lacks 'deepseek2.{key}', which latent attention needs")
    rope, qk = int(meta("rope.dimension_count")), int(meta("attention.key_length_mla"))
    rank = int(meta("attention.kv_lora_rank"))
    if int(meta("attention.key_length", rank + rope)) != rank + rope:
        raise WeightsError(f"{path}: deepseek2.attention.key_length = {meta('attention.key_length')} is not "
                           f"kv_lora_rank + rope dims = {rank + rope}; the file is inconsistent")
    experts = int(meta("expert_count", 0) or 0)
    fields = {"num_key_value_heads": hf["num_attention_heads"], "kv_lora_rank": rank,
              "q_lora_rank": int(meta("attention.q_lora_rank", 0) or 0) or None,
              "qk_rope_head_dim": rope, "qk_nope_head_dim": qk - rope,
              "v_head_dim": int(meta("attention.value_length_mla")),
              "intermediate_size": int(meta("feed_forward_length")), "rope_interleave": True,  # llama.cpp's NORM RoPE
              "moe_intermediate_size": int(meta("expert_feed_forward_length", 0) or 0),
              "n_routed_experts": experts or None, "num_experts_per_tok": int(meta("expert_used_count", 0) or 0),
              "n_shared_experts": int(meta("expert_shared_count", 0) or 0),
              "first_k_dense_replace": int(meta("leading_dense_block_count", 0) or 0),
              "n_group": int(meta("expert_group_count", 1) or 1), "topk_group": int(meta("expert_group_used_count", 1) or 1),
              "routed_scaling_factor": float(meta("expert_weights_scale", 1.0)),
              "norm_topk_prob": bool(meta("expert_weights_norm", False)), "scoring_func": "sigmoid",
              "topk_method": "noaux_tc" if any(n.endswith(".exp_probs_b.bias") for n in tensors) else "greedy"}
    if rope_scaling is not None:
        fields["rope_scaling"] = rope_scaling
    return fields


def _deepseek2_yarn(meta, hf: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """DeepSeek's YaRN from the file: llama.cpp's converter writes the type, factor, original
    context, beta_fast/slow when the checkpoint has them, and ``yarn_log_multiplier`` = 0.1 x
    ``mscale_all_dim``; not ``mscale``, which llama.cpp's deepseek2 graph takes as equal to
    ``mscale_all_dim`` (the RoPE tables unscaled, the softmax scale times mscale squared, as
    DeepSeek-V3's config gives: mscale = mscale_all_dim = 1.0). None without scaling. (Other
    YaRN keys, ext and attn factors, are refused by gguf_keys.py's check of unknown keys.)"""
    scaling = hf.get("rope_scaling")
    if scaling is None:
        return None
    if scaling.get("rope_type") != "yarn":
        raise WeightsError(f"{path}: deepseek2.rope.scaling.type = {scaling.get('rope_type')!r} is not "
                           "implemented for 'deepseek2' files (only yarn, DeepSeek's)")
    if "original_max_position_embeddings" not in scaling:
        raise WeightsError(f"{path}: deepseek2 YaRN without 'deepseek2.rope.scaling.original_context_length'")
    log_multiplier = meta("rope.scaling.yarn_log_multiplier")
    mscale = {} if log_multiplier is None else {"mscale": float(log_multiplier) / 0.1,
                                                "mscale_all_dim": float(log_multiplier) / 0.1}
    return dict(scaling, beta_fast=float(meta("rope.scaling.yarn_beta_fast", 32.0)),
                beta_slow=float(meta("rope.scaling.yarn_beta_slow", 1.0)), **mscale)


def qwen3next(meta, hf: dict[str, Any], tensors: Shapes, path: Path) -> dict[str, Any]:
    """Qwen3-Next: which layers are Gated DeltaNet (``attention.recurrent_layers``, else every
    layer but each ``full_attention_interval``-th), their sizes from the ``ssm.*`` keys."""
    _refuse_rope_scaling(meta, path, "qwen3next")
    num_layers = hf["num_hidden_layers"]
    recurrent = meta("attention.recurrent_layers")
    if recurrent is None:
        interval = int(meta("full_attention_interval", 4))
        recurrent = [(i + 1) % interval != 0 for i in range(num_layers)]
    if len(recurrent) != num_layers:
        raise WeightsError(f"{path}: qwen3next.attention.recurrent_layers has {len(recurrent)} entries for "
                           f"{num_layers} layers; the file is inconsistent")
    key_heads, value_heads = int(meta("ssm.group_count")), int(meta("ssm.time_step_rank"))
    inner = int(meta("ssm.inner_size"))
    if inner % value_heads:
        raise WeightsError(f"{path}: qwen3next.ssm.inner_size = {inner} is not a multiple of "
                           f"ssm.time_step_rank = {value_heads} (value heads)")
    moe = [i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" in tensors]
    return {"layer_types": ["linear_attention" if r else "full_attention" for r in recurrent],
            "linear_conv_kernel_dim": int(meta("ssm.conv_kernel")), "linear_key_head_dim": int(meta("ssm.state_size")),
            "linear_num_key_heads": key_heads, "linear_num_value_heads": value_heads,
            "linear_value_head_dim": inner // value_heads,
            "partial_rotary_factor": _rotary_factor(meta, hf["head_dim"], path, "qwen3next"),
            "intermediate_size": int(meta("feed_forward_length")),
            "moe_intermediate_size": int(meta("expert_feed_forward_length", 0) or 0),
            "shared_expert_intermediate_size": int(meta("expert_shared_feed_forward_length", 0) or 0),
            "num_experts": int(meta("expert_count", 0) or 0), "num_experts_per_tok": int(meta("expert_used_count", 0) or 0),
            "norm_topk_prob": True,  # llama.cpp's qwen3next graph always renormalises
            "mlp_only_layers": [i for i in range(num_layers) if i not in moe]}


# ------------------------------------------------------------------ tensors back to HF form

def combine_deepseek2(tensors: dict[str, Any], config) -> dict[str, Any]:
    """``k_b_proj`` (H, r, n) and ``v_b_proj`` (H, v, r) -> ``kv_b_proj`` (H x (n + v), r)."""
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(".self_attn.v_b_proj.weight"):
            continue
        if name.endswith(".self_attn.k_b_proj.weight"):
            v_b = tensors[name.replace(".k_b_proj.", ".v_b_proj.")]  # (H, v, r)
            kv_b = torch.cat((tensor.transpose(1, 2), v_b), dim=1)  # (H, n + v, r)
            out[name.replace(".k_b_proj.", ".kv_b_proj.")] = kv_b.reshape(-1, kv_b.shape[-1]).contiguous()
            continue
        out[name] = tensor
    return out


def combine_qwen3next(tensors: dict[str, Any], config) -> dict[str, Any]:
    """Undo the converter's rewrites of Qwen3-Next's tensors (module doc)."""
    from inferpath.config_kinds import linear_key_dim

    heads, kd = config.linear_num_key_heads, linear_key_dim(config)
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(".linear_attn.in_proj_z.weight"):
            continue
        if name.endswith(".linear_attn.in_proj_qkv.weight"):
            z = tensors[name.replace("in_proj_qkv", "in_proj_z")]  # (Hk * g * dv, hidden)
            q, k, v = tensor.split((kd, kd, tensor.shape[0] - 2 * kd))
            parts = [t.reshape(heads, -1, t.shape[-1]) for t in (q, k, v, z)]  # per key head
            out[name.replace("in_proj_qkv", "in_proj_qkvz")] = torch.cat(parts, dim=1).reshape(-1, tensor.shape[-1])
            continue
        if name.endswith(".linear_attn.ssm_a"):  # -exp(A_log)
            out[name.replace("ssm_a", "A_log")] = torch.log(-tensor.float()).to(tensor.dtype)
            continue
        if name.endswith(".linear_attn.conv1d.weight"):
            out[name] = tensor.unsqueeze(1)  # (channels, kernel) -> (channels, 1, kernel)
            continue
        if name.endswith("norm.weight") and not name.endswith(".linear_attn.norm.weight"):
            out[name] = tensor - 1  # stored as 1 + w
            continue
        out[name] = tensor
    return out
