"""GGUF files of Llama 4 text and gpt-oss: their fields from metadata, and their stacked
experts put back into the Hugging Face layout (weights/gguf_arch.py's entries call these).

llama.cpp stores each MoE layer's experts as three stacked tensors, ``ffn_{gate,up,down}
_exps`` (num_experts, out, in), each expert's weight as ``W`` (rows = outputs). Both
families' checkpoints store them transposed and fused instead (x @ W):

- Llama 4: ``feed_forward.experts.gate_up_proj`` (E, hidden, 2 * inter), gate in the
  first half of the columns, up in the second; ``down_proj`` (E, inter, hidden);
- gpt-oss: ``mlp.experts.gate_up_proj`` (E, hidden, 2 * inter) with gate in the even
  columns and up in the odd ones, its bias ``gate_up_proj_bias`` (E, 2 * inter) likewise;
  ``down_proj`` (E, inter, hidden) and ``down_proj_bias``.

The reader renames ``ffn_*_exps`` to the temporary names ``experts.{gate,up,down}_exps``
(the entries' renames); ``regroup_*`` turns those into the checkpoint's tensors, so that the
model loads them by name exactly as from the Hugging Face directory.

Llama 4's converter does not permute Q and K (its RoPE turns adjacent pairs, as llama.cpp's
does): their rows are reordered here as for its Hugging Face checkpoints (names.py
``rotate_half_rows``). The metadata says nothing of NoPE layers, chunks, temperature or the
QK-norm: llama.cpp fixes them (``src/models/llama4.cpp`` of llama-cpp-python 0.3.36) and so
does ``llama4_fields``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from inferpath.weights.errors import WeightsError
from inferpath.weights.quantized import QuantizedTensor

_EXPERTS = {"ffn_gate_exps": "experts.gate_exps", "ffn_up_exps": "experts.up_exps",
            "ffn_down_exps": "experts.down_exps"}
LLAMA4_RENAMES = {
    "ffn_gate": "feed_forward.gate_proj", "ffn_up": "feed_forward.up_proj", "ffn_down": "feed_forward.down_proj",
    "ffn_gate_inp": "feed_forward.router",
    "ffn_gate_shexp": "feed_forward.shared_expert.gate_proj", "ffn_up_shexp": "feed_forward.shared_expert.up_proj",
    "ffn_down_shexp": "feed_forward.shared_expert.down_proj",
    **{k: "feed_forward." + v for k, v in _EXPERTS.items()},
}
GPT_OSS_RENAMES = {
    "post_attention_norm": "post_attention_layernorm", "attn_sinks": "self_attn.sinks",
    "ffn_gate_inp": "mlp.router", **{k: "mlp." + v for k, v in _EXPERTS.items()},
}


def llama4_fields(meta: Any, hf: dict[str, Any], tensors: Mapping[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """Llama 4's config.json fields as llama.cpp runs a file without a sliding-window key:
    every 4th layer NoPE, the others chunked by 8192, temperature tuning (floor 8192, scale
    0.1) on the NoPE layers, QK-norm except on the 128-expert model, MoE every
    ``interleave_moe_layer_step``-th layer."""
    window = meta("attention.sliding_window")
    if window is not None:  # 0: llama.cpp's MobileLLM variant, RoPE on all but the last layer
        raise WeightsError(f"{path}: llama4.attention.sliding_window = {window} (llama.cpp's "
                           "all-full-attention variant) is not implemented; only files without the key")
    num_experts = int(meta("expert_count", 0) or 0)
    step = int(meta("interleave_moe_layer_step", 1) or 0)
    if num_experts == 0 or step <= 0:
        raise WeightsError(f"{path}: a Llama 4 file without experts (expert_count {num_experts}, "
                           f"interleave_moe_layer_step {step}) is not implemented")
    return {
        "intermediate_size": int(meta("expert_feed_forward_length")),
        "intermediate_size_mlp": int(meta("feed_forward_length")),
        "num_local_experts": num_experts, "num_experts_per_tok": int(meta("expert_used_count")),
        "interleave_moe_layer_step": step, "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
        "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
        "use_qk_norm": not (num_experts == 128 and hf["hidden_size"] == 5120),  # llama.cpp: not 17B-128E
        "attention_bias": "blk.0.attn_q.bias" in tensors,
    }


def gpt_oss_fields(meta: Any, hf: dict[str, Any], tensors: Mapping[str, tuple[int, ...]], path: Path) -> dict[str, Any]:
    """gpt-oss: every other layer slides (the first included, llama.cpp's pattern 2),
    biases everywhere, YaRN without truncation as its checkpoints configure it, the
    clamped SwiGLU at llama.cpp's fixed limit and alpha (``src/models/openai-moe.cpp``)."""
    window = int(meta("attention.sliding_window", 0) or 0)
    if window <= 0:
        raise WeightsError(f"{path}: gpt-oss.attention.sliding_window is missing or 0; gpt-oss slides "
                           "every other layer")
    fields: dict[str, Any] = {
        "intermediate_size": int(meta("expert_feed_forward_length") or meta("feed_forward_length")),
        "num_local_experts": int(meta("expert_count")), "num_experts_per_tok": int(meta("expert_used_count")),
        "sliding_window": window,
        # not in the file: llama.cpp's swiglu_oai always clamps at 7 with alpha 1.702
        "swiglu_limit": 7.0, "swiglu_alpha": 1.702,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(hf["num_hidden_layers"])],
    }
    scaling = hf.get("rope_scaling")
    if scaling is not None and scaling.get("rope_type") == "yarn":
        fields["rope_scaling"] = dict(scaling, beta_fast=float(meta("rope.scaling.yarn_beta_fast", 32.0)),
                                      beta_slow=float(meta("rope.scaling.yarn_beta_slow", 1.0)), truncate=False)
    return fields


def _dense(tensor: torch.Tensor | QuantizedTensor | tuple) -> torch.Tensor:
    """Float values of a read tensor; a tuple (each expert's blocks, keep_quantized) stacked."""
    if isinstance(tensor, tuple):
        return torch.stack([t.dequantize() for t in tensor])
    return tensor.dequantize() if isinstance(tensor, QuantizedTensor) else tensor


def _take(tensors: dict, prefix: str, part: str) -> torch.Tensor:
    return _dense(tensors.pop(f"{prefix}.experts.{part}_exps.weight"))


def regroup_llama4(tensors: dict, config: Any) -> dict:
    """Stacked experts into Llama 4's ``gate_up_proj`` / ``down_proj``; Q/K rows into
    rotate-half order (module doc)."""
    from inferpath.weights.names import rotate_half_rows

    for prefix in sorted({n.rsplit(".experts.", 1)[0] for n in tensors if ".experts.gate_exps." in n}):
        gate, up = _take(tensors, prefix, "gate"), _take(tensors, prefix, "up")  # (E, inter, hidden)
        tensors[f"{prefix}.experts.gate_up_proj"] = torch.cat((gate, up), dim=1).transpose(1, 2).contiguous()
        tensors[f"{prefix}.experts.down_proj"] = _take(tensors, prefix, "down").transpose(1, 2).contiguous()
    floats = rotate_half_rows({n: t for n, t in tensors.items() if not isinstance(t, QuantizedTensor)}, config)
    return {**floats, **_qk_blocks_reordered({n: t for n, t in tensors.items() if isinstance(t, QuantizedTensor)},
                                             config)}


def _qk_blocks_reordered(tensors: dict, config: Any) -> dict:
    """Q/K kept as blocks (keep_quantized) reordered by whole rows as ``rotate_half_rows``
    reorders float ones; the other blocks pass through."""
    d = config.head_dim
    order = torch.tensor([*range(0, d, 2), *range(1, d, 2)])
    for name, tensor in list(tensors.items()):
        if isinstance(tensor, QuantizedTensor) and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            heads = tensor.shape[0] // d
            rows = (torch.arange(heads).view(-1, 1) * d + order.view(1, -1)).reshape(-1)
            tensors[name] = QuantizedTensor(tensor.data.index_select(0, rows), tensor.qtype, tensor.shape)
    return tensors


def regroup_gpt_oss(tensors: dict, config: Any) -> dict:
    """Stacked experts (and their biases) into gpt-oss's interleaved ``gate_up_proj``."""
    for prefix in sorted({n.rsplit(".experts.", 1)[0] for n in tensors if ".experts.gate_exps." in n}):
        if isinstance(tensors[f"{prefix}.experts.gate_exps.weight"], tuple):  # blocks kept: one tensor per expert
            for part in ("gate", "up", "down"):
                for e, blocks in enumerate(tensors.pop(f"{prefix}.experts.{part}_exps.weight")):
                    tensors[f"{prefix}.experts.{part}_proj.{e}.weight"] = blocks
            gate_b, up_b = tensors.pop(f"{prefix}.experts.gate_exps.bias"), tensors.pop(f"{prefix}.experts.up_exps.bias")
            tensors[f"{prefix}.experts.gate_up_proj_bias"] = torch.stack((gate_b, up_b), dim=2).reshape(len(gate_b), -1)
            tensors[f"{prefix}.experts.down_proj_bias"] = tensors.pop(f"{prefix}.experts.down_exps.bias")
            continue
        gate, up = _take(tensors, prefix, "gate"), _take(tensors, prefix, "up")  # (E, inter, hidden)
        num_experts, inter, hidden = gate.shape
        fused = torch.stack((gate, up), dim=2).reshape(num_experts, 2 * inter, hidden)  # rows g0, u0, g1, u1, ...
        tensors[f"{prefix}.experts.gate_up_proj"] = fused.transpose(1, 2).contiguous()
        tensors[f"{prefix}.experts.down_proj"] = _take(tensors, prefix, "down").transpose(1, 2).contiguous()
        gate_b = tensors.pop(f"{prefix}.experts.gate_exps.bias")
        up_b = tensors.pop(f"{prefix}.experts.up_exps.bias")
        tensors[f"{prefix}.experts.gate_up_proj_bias"] = torch.stack((gate_b, up_b), dim=2).reshape(num_experts, -1)
        tensors[f"{prefix}.experts.down_proj_bias"] = tensors.pop(f"{prefix}.experts.down_exps.bias")
    for name in [n for n in tensors if n.endswith(".self_attn.sinks.weight")]:  # a parameter of its own in HF
        tensors[name.removesuffix(".weight")] = tensors.pop(name)
    return tensors


_BLOCKS = re.compile(r"^(.*\.mlp\.experts)\.(gate|up|down)_proj\.(\d+)\.weight$")


def expert_blocks(tensors: dict, shapes: dict, path: Path) -> tuple[set[str], set[str]]:
    """(the per-expert block tensors kept by ``regroup_gpt_oss``, the stacked checkpoint
    tensors they stand for), after checking them against those tensors' expected shapes:
    gate and up (inter, hidden), down (hidden, inter), one of each per expert."""
    blocks, covered = set(), set()
    for name, tensor in tensors.items():
        if (m := _BLOCKS.match(name)) is None:
            continue
        prefix, part, e = m.groups()
        fused, down = shapes.get(f"{prefix}.gate_up_proj"), shapes.get(f"{prefix}.down_proj")
        if fused is None or down is None:
            raise WeightsError(f"{path}: expert blocks {name!r} belong to no stacked experts of this model")
        num_experts, hidden, inter = down[0], down[2], down[1]
        expected = (hidden, inter) if part == "down" else (inter, hidden)
        if int(e) >= num_experts or tuple(tensor.shape) != expected:
            raise WeightsError(f"{path}: expert blocks {name!r} have shape {tuple(tensor.shape)}, expected "
                               f"{expected} for expert {e} of {num_experts}")
        blocks.add(name)
        covered |= {f"{prefix}.gate_up_proj", f"{prefix}.down_proj"}
    for prefix in {c.rsplit(".", 1)[0] for c in covered}:
        count = shapes[f"{prefix}.down_proj"][0]
        for part in ("gate", "up", "down"):
            for e in range(count):
                if f"{prefix}.{part}_proj.{e}.weight" not in tensors:
                    raise WeightsError(f"{path}: missing the blocks of expert {e}'s {part} projection under {prefix!r}")
    return blocks, covered
