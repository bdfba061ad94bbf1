"""``config.json`` of Llama 4 text (``llama4_text``) into ModelConfig keyword arguments.

The fields hf_config.py reads for every family (shapes, RoPE, the expert count) are read
there; this file reads what only Llama 4 has, with transformers 5.24's defaults
(``Llama4TextConfig``) where a field is absent:

- ``intermediate_size`` is each routed expert's and the shared expert's width, and
  ``intermediate_size_mlp`` the dense layers'; the MoE layers are ``moe_layers``, else every
  ``interleave_moe_layer_step``-th layer (the step's last);
- ``no_rope_layers`` (1 = RoPE, 0 = NoPE; an empty list or none: every
  ``no_rope_layer_interval``-th layer is NoPE);
- ``layer_types``: the RoPE layers are "chunked_attention" when ``attention_chunk_size`` is
  set, the NoPE layers "full_attention";
- ``use_qk_norm``: an L2 norm of Q and K after RoPE, on the RoPE layers only;
- ``attn_temperature_tuning`` with ``floor_scale`` and ``attn_scale``: Q of the NoPE layers
  scaled by position.

Any value outside what transformers' model does is an error naming it.
"""

from __future__ import annotations

from typing import Any

from inferpath.hf_config import UnsupportedFieldError

_LAYER_TYPES = ("full_attention", "chunked_attention")


def rope_layer_flags(cfg: dict[str, Any], num_layers: int) -> list[int]:
    """Per layer 1 (RoPE) or 0 (NoPE), as Llama4TextConfig derives them."""
    flags = cfg.get("no_rope_layers")
    if not flags:  # transformers: None or [] -> every interval-th layer without RoPE
        interval = int(cfg.get("no_rope_layer_interval", 4))
        if interval <= 0:
            raise UnsupportedFieldError(f"no_rope_layer_interval = {interval!r} must be a positive integer")
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(flags) != num_layers or not set(flags) <= {0, 1}:
        raise UnsupportedFieldError(f"no_rope_layers {list(flags)!r} must be a 0 or 1 for each of the "
                                    f"{num_layers} layers")
    return [int(f) for f in flags]


def moe_layers(cfg: dict[str, Any], num_layers: int) -> list[int]:
    """The layers with experts: ``moe_layers``, else every ``interleave_moe_layer_step``-th."""
    layers = cfg.get("moe_layers")
    if layers is None:
        step = int(cfg.get("interleave_moe_layer_step", 1))
        if step <= 0:
            raise UnsupportedFieldError(f"interleave_moe_layer_step = {step!r} must be a positive integer")
        layers = list(range(step - 1, num_layers, step))
    if any(not isinstance(i, int) or not 0 <= i < num_layers for i in layers):
        raise UnsupportedFieldError(f"moe_layers {list(layers)!r} must be layer indices below {num_layers}")
    return sorted(set(layers))


def llama4_layer_types(cfg: dict[str, Any], rope_flags: list[int]) -> tuple[str, ...]:
    chunk = cfg.get("attention_chunk_size")
    types = cfg.get("layer_types")
    if types is None:
        types = ["chunked_attention" if rope and chunk is not None else "full_attention" for rope in rope_flags]
    if len(types) != len(rope_flags) or not set(types) <= set(_LAYER_TYPES):
        raise UnsupportedFieldError(f"layer_types {list(types)!r} must name one of {', '.join(_LAYER_TYPES)} "
                                    f"for each of the {len(rope_flags)} layers")
    if "chunked_attention" in types and not chunk:
        raise UnsupportedFieldError("layer_types has chunked_attention layers but attention_chunk_size is "
                                    f"{chunk!r} (transformers refuses that model too)")
    return tuple(types)


def llama4_text_fields(cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The ModelConfig keyword arguments that differ from hf_config.py's reading."""
    rope = rope_layer_flags(cfg, num_layers)
    moe = set(moe_layers(cfg, num_layers)) if int(cfg.get("num_local_experts") or 0) else set()
    types = llama4_layer_types(cfg, rope)
    tuning = bool(cfg.get("attn_temperature_tuning", True))
    floor = cfg.get("floor_scale", 8192)
    if tuning and (not isinstance(floor, (int, float)) or floor <= 0 or int(floor) != floor):
        raise UnsupportedFieldError(f"floor_scale = {floor!r} must be a positive integer")
    bias = bool(cfg.get("attention_bias", False))
    expert_width = int(cfg["intermediate_size"])
    return dict(
        intermediate_size=int(cfg.get("intermediate_size_mlp", 16384)),
        moe_intermediate_size=expert_width,
        shared_expert_intermediate_size=expert_width if moe else 0,
        dense_layers=tuple(i for i in range(num_layers) if i not in moe),
        no_rope_layers=tuple(i for i, flag in enumerate(rope) if not flag),
        layer_types=types if "chunked_attention" in types else None,
        attention_chunk_size=int(cfg["attention_chunk_size"]) if "chunked_attention" in types else 0,
        qk_norm="l2_rope" if cfg.get("use_qk_norm", True) else "",
        attn_temperature_floor=int(floor) if tuning else 0,
        attn_temperature_scale=float(cfg.get("attn_scale", 0.1)) if tuning else 0.0,
        attention_bias=bias, o_proj_bias=bias,
        moe_router="sigmoid_prescaled",
        norm_topk_prob=False,
    )
