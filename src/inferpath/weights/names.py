"""The rename table from llama.cpp's GGUF tensor names to Hugging Face's.

inferpath keeps Hugging Face names everywhere (design.md: "loading is a rename table"),
so the GGUF reader renames as it reads. ``expected_shapes`` is the other half of the
contract: for a ModelConfig, every tensor the model needs and its shape, which both
readers check before handing tensors to the model.
"""

from __future__ import annotations

import re

from inferpath.config import ROUTED_MOE_ARCHITECTURES, ModelConfig

# GGUF per-layer suffix -> Hugging Face per-layer suffix (after "model.layers.{i}.")
_LAYER_RENAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "block_sparse_moe.gate",
}
# Mixtral expert weights: w1 = gate, w3 = up, w2 = down (Mixtral's own naming)
MOE_EXPERT_NAMES = {"ffn_gate": "w1", "ffn_up": "w3", "ffn_down": "w2"}
_GLOBAL_RENAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Tensors some GGUF files carry that Hugging Face recomputes (RoPE frequency tables).
IGNORED_GGUF_TENSORS = re.compile(r"^(rope_freqs|blk\.\d+\.attn_rot_embd)\.weight$")

# Hugging Face buffers some checkpoints carry that the model recomputes.
IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)

_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_OLD_EXPERT_RE = re.compile(r"^blk\.(\d+)\.(ffn_gate|ffn_up|ffn_down)\.(\d+)\.weight$")
_STACKED_EXPERT_RE = re.compile(r"^blk\.(\d+)\.(ffn_gate|ffn_up|ffn_down)_exps\.weight$")


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of one (non-stacked) GGUF tensor, or None if unknown.

    >>> hf_name("blk.3.attn_q.weight")
    'model.layers.3.self_attn.q_proj.weight'
    """
    head, _, kind = gguf_name.rpartition(".")
    if head in _GLOBAL_RENAMES and kind == "weight":
        return f"{_GLOBAL_RENAMES[head]}.weight"
    if m := _OLD_EXPERT_RE.match(gguf_name):
        layer, ffn, expert = m.groups()
        return f"model.layers.{layer}.block_sparse_moe.experts.{expert}.{MOE_EXPERT_NAMES[ffn]}.weight"
    if (m := _LAYER_RE.match(gguf_name)) and m.group(2) in _LAYER_RENAMES:
        layer, part, kind = m.groups()
        return f"model.layers.{layer}.{_LAYER_RENAMES[part]}.{kind}"
    return None


def stacked_expert_names(gguf_name: str, num_experts: int) -> list[str] | None:
    """HF names of the experts in a stacked ``blk.N.ffn_*_exps.weight``, or None."""
    m = _STACKED_EXPERT_RE.match(gguf_name)
    if m is None:
        return None
    layer, ffn = m.groups()
    w = MOE_EXPERT_NAMES[ffn]
    return [f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight" for e in range(num_experts)]


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a model of this config loads, in Hugging Face names, with its shape.

    Invariant: exactly the set ``Transformer.load_weights`` consumes: ``lm_head.weight``
    only when the head is untied, Q/K/V biases only when ``attention_bias``, the o_proj
    bias with ``o_proj_bias``, MLP biases with ``mlp_bias``.
    """
    if config.is_mla:  # DeepSeek-V3: latent attention, its own MoE names
        from inferpath.weights.names_mla import deepseek_shapes

        return deepseek_shapes(config)
    if config.architecture == "qwen3_next":  # Gated DeltaNet + gated attention layers
        from inferpath.weights.names_hybrid import qwen3_next_shapes

        return qwen3_next_shapes(config)
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes[p + "self_attn.q_proj.weight"] = (config.q_size, hidden)
        shapes[p + "self_attn.k_proj.weight"] = (config.kv_size, hidden)
        shapes[p + "self_attn.v_proj.weight"] = (config.kv_size, hidden)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, config.q_size)
        if config.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (config.q_size,)
            shapes[p + "self_attn.k_proj.bias"] = (config.kv_size,)
            shapes[p + "self_attn.v_proj.bias"] = (config.kv_size,)
        if config.o_proj_bias:
            shapes[p + "self_attn.o_proj.bias"] = (hidden,)
        if config.qk_norm:
            per_head = config.qk_norm == "head"
            shapes[p + "self_attn.q_norm.weight"] = (config.head_dim if per_head else config.q_size,)
            shapes[p + "self_attn.k_norm.weight"] = (config.head_dim if per_head else config.kv_size,)
        if config.sandwich_norms:
            shapes[p + "pre_feedforward_layernorm.weight"] = (hidden,)
            shapes[p + "post_feedforward_layernorm.weight"] = (hidden,)
        if config.is_moe_layer(i) and config.architecture in ROUTED_MOE_ARCHITECTURES:
            shapes[p + "mlp.gate.weight"] = (config.num_experts, hidden)
            experts = [(f"{p}mlp.experts.{e}.", config.expert_intermediate_size) for e in range(config.num_experts)]
            if config.shared_expert_intermediate_size:
                experts.append((f"{p}mlp.shared_expert.", config.shared_expert_intermediate_size))
                shapes[p + "mlp.shared_expert_gate.weight"] = (1, hidden)
            for q, width in experts:
                shapes[q + "gate_proj.weight"] = (width, hidden)
                shapes[q + "up_proj.weight"] = (width, hidden)
                shapes[q + "down_proj.weight"] = (hidden, width)
        elif config.is_moe_layer(i):
            shapes[p + "block_sparse_moe.gate.weight"] = (config.num_experts, hidden)
            for e in range(config.num_experts):
                q = f"{p}block_sparse_moe.experts.{e}."
                shapes[q + "w1.weight"] = (inter, hidden)
                shapes[q + "w3.weight"] = (inter, hidden)
                shapes[q + "w2.weight"] = (hidden, inter)
        else:
            shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
            shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
            shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
            if config.mlp_bias:
                shapes[p + "mlp.gate_proj.bias"] = (inter,)
                shapes[p + "mlp.up_proj.bias"] = (inter,)
                shapes[p + "mlp.down_proj.bias"] = (hidden,)
    return shapes


def is_ignorable(name: str, config: ModelConfig) -> bool:
    """A checkpoint tensor the model need not read: RoPE tables it recomputes, or the head
    of a model whose head is tied to the embedding (saved anyway by some exporters)."""
    if name.endswith(IGNORED_HF_SUFFIXES):
        return True
    if config.architecture == "deepseek_v3":  # the multi-token-prediction module: a drafter, not run
        from inferpath.weights.names_mla import is_mtp_tensor

        if is_mtp_tensor(name, config):
            return True
    return name == "lm_head.weight" and config.tie_word_embeddings


_HF_TO_GGUF_LAYER = {v: k for k, v in _LAYER_RENAMES.items()}
_HF_TO_GGUF_GLOBAL = {v: k for k, v in _GLOBAL_RENAMES.items()}
_HF_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_HF_EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")


def gguf_name(hf: str) -> str:
    """The GGUF name a Hugging Face tensor name comes from (for error messages)."""
    head, _, kind = hf.rpartition(".")
    if head in _HF_TO_GGUF_GLOBAL:
        return f"{_HF_TO_GGUF_GLOBAL[head]}.{kind}"
    if m := _HF_EXPERT_RE.match(hf):
        layer, _expert, w = m.groups()
        ffn = {v: k for k, v in MOE_EXPERT_NAMES.items()}[w]
        return f"blk.{layer}.{ffn}_exps.weight"
    if (m := _HF_LAYER_RE.match(hf)) and m.group(2) in _HF_TO_GGUF_LAYER:
        layer, part, kind = m.groups()
        return f"blk.{layer}.{_HF_TO_GGUF_LAYER[part]}.{kind}"
    return hf


# Checkpoints that store some projections fused along rows: fused suffix -> the parts, in
# row order (Phi-3: qkv_proj = q, k, v; gate_up_proj = gate, up). The model keeps the parts.
FUSED_PROJECTIONS = {
    "phi3": {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                           "self_attn.v_proj.weight"),
             "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")},
}


def checkpoint_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """``expected_shapes`` as the checkpoint file stores them: fused projections fused."""
    shapes = expected_shapes(config)
    fused = FUSED_PROJECTIONS.get(config.architecture)
    if not fused:
        return shapes
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        for fused_suffix, parts in fused.items():
            if name.endswith(parts[0]):
                prefix = name[: -len(parts[0])]
                rows = sum(shapes[prefix + part][0] for part in parts)
                out[prefix + fused_suffix] = (rows, *shape[1:])
                break
            if any(name.endswith(part) for part in parts[1:]):
                break
        else:
            out[name] = shape
    return out


def split_fused(tensors: dict, config: ModelConfig) -> dict:
    """Checkpoint tensors -> the model's names: each fused projection cut into its parts
    (row views, no copy); other tensors unchanged."""
    fused = FUSED_PROJECTIONS.get(config.architecture)
    if not fused:
        return tensors
    shapes = expected_shapes(config)
    out = {}
    for name, tensor in tensors.items():
        suffix = next((f for f in fused if name.endswith(f)), None)
        if suffix is None:
            out[name] = tensor
            continue
        prefix, start = name[: -len(suffix)], 0
        for part in fused[suffix]:
            rows = shapes[prefix + part][0]
            out[prefix + part] = tensor[start:start + rows]
            start += rows
    return out
