"""The rename table from llama.cpp's GGUF tensor names to Hugging Face's.

inferpath keeps Hugging Face names everywhere (design.md: "loading is a rename table"),
so the GGUF reader renames as it reads. ``expected_shapes`` is the other half of the
contract: for a ModelConfig, every tensor the model needs and its shape, which both
readers check before handing tensors to the model.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

from inferpath.config import ModelConfig
from inferpath.families import FAMILIES

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


def hf_name(gguf_name: str, renames: Mapping[str, str] | None = None) -> str | None:
    """The Hugging Face name of one (non-stacked) GGUF tensor, or None if unknown;
    ``renames``: an architecture's per-layer renames, over the Llama table (gguf_arch.py).

    >>> hf_name("blk.3.attn_q.weight")
    'model.layers.3.self_attn.q_proj.weight'
    """
    layer_renames = {**_LAYER_RENAMES, **renames} if renames else _LAYER_RENAMES
    head, _, kind = gguf_name.rpartition(".")
    if head in _GLOBAL_RENAMES and kind == "weight":
        return f"{_GLOBAL_RENAMES[head]}.weight"
    if m := _OLD_EXPERT_RE.match(gguf_name):
        layer, ffn, expert = m.groups()
        return f"model.layers.{layer}.block_sparse_moe.experts.{expert}.{MOE_EXPERT_NAMES[ffn]}.weight"
    if (m := _LAYER_RE.match(gguf_name)) and m.group(2) in layer_renames:
        layer, part, kind = m.groups()
        return f"model.layers.{layer}.{layer_renames[part]}.{kind}"
    return None


def stacked_expert_names(gguf_name: str, num_experts: int, routed: bool = False) -> list[str] | None:
    """HF names of the experts in a stacked ``blk.N.ffn_*_exps.weight``, or None: Mixtral's
    ``block_sparse_moe.experts.E.w1`` ..., or with ``routed`` (OLMoE, Qwen2-MoE)
    ``mlp.experts.E.gate_proj`` ..."""
    m = _STACKED_EXPERT_RE.match(gguf_name)
    if m is None:
        return None
    layer, ffn = m.groups()
    if routed:
        proj = ffn.removeprefix("ffn_")
        return [f"model.layers.{layer}.mlp.experts.{e}.{proj}_proj.weight" for e in range(num_experts)]
    w = MOE_EXPERT_NAMES[ffn]
    return [f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight" for e in range(num_experts)]


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a model of this config loads, in Hugging Face names, with its shape.

    Invariant: exactly the set ``Transformer.load_weights`` consumes, because it is read
    off that model, built on the meta device (no storage): ``lm_head.weight`` only when the
    head is untied, each bias, norm and expert only where the config's flags create it.
    """
    if config.is_mla:  # DeepSeek-V3: latent attention, its own MoE names
        from inferpath.weights.names_mla import deepseek_shapes

        return deepseek_shapes(config)
    if config.num_linear_layers:  # Gated DeltaNet + gated attention layers (Qwen3-Next, Qwen3.5)
        from inferpath.weights.names_hybrid import qwen3_next_shapes

        return qwen3_next_shapes(config)
    return dict(_meta_shapes(config))


@functools.lru_cache(maxsize=8)
def _meta_shapes(config: ModelConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    from inferpath.model.transformer import Transformer  # the model imports no weights module

    return tuple(Transformer(config, device="meta").expected_weight_shapes().items())


def is_ignorable(name: str, config: ModelConfig) -> bool:
    """A checkpoint tensor the model need not read: RoPE tables it recomputes, the head
    of a model whose head is tied to the embedding (saved anyway by some exporters), or a
    layer past the last one where the family says so (GLM-4's multi-token prediction)."""
    if name.endswith(IGNORED_HF_SUFFIXES):
        return True
    if config.architecture == "deepseek_v3":  # the multi-token-prediction module: a drafter, not run
        from inferpath.weights.names_mla import is_mtp_tensor

        if is_mtp_tensor(name, config):
            return True
    entry = FAMILIES.get(config.architecture)
    if entry is not None and entry.extra_layers_ignored and (m := _HF_LAYER_INDEX_RE.match(name)):
        return int(m.group(1)) >= config.num_layers
    return name == "lm_head.weight" and config.tie_word_embeddings


_HF_LAYER_INDEX_RE = re.compile(r"^model\.layers\.(\d+)\.")
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


# Checkpoints that store some projections fused along rows (Phi-3's qkv_proj = q, k, v;
# gate_up_proj = gate, up): families.py's ``fused_projections``. The model keeps the parts.
FUSED_PROJECTIONS = {name: f.fused_projections for name, f in FAMILIES.items() if f.fused_projections}


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


def split_fused(tensors: dict, config: ModelConfig, take_rows=lambda tensor, start, end: tensor[start:end]) -> dict:
    """Checkpoint tensors -> the model's names: each fused projection cut into its parts
    (row views by ``take_rows``, no copy); other tensors unchanged."""
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
            out[prefix + part] = take_rows(tensor, start, start + rows)
            start += rows
    return out


def rotate_half_rows(tensors: dict, config: ModelConfig) -> dict:
    """A family stored for RoPE over adjacent pairs (families.py ``interleaved_rope``):
    each head's Q and K rows (and biases) reordered even-then-odd, so that the model's
    rotate-half RoPE turns the pairs the checkpoint meant. q . k is a sum over a head's
    dimensions, the same in any order, so attention is unchanged; V and O are not touched.
    Other families' tensors are returned as they are."""
    entry = FAMILIES.get(config.architecture)
    if entry is None or not entry.interleaved_rope:
        return tensors
    d = config.head_dim
    order = [*range(0, d, 2), *range(1, d, 2)]  # (head_dim,): rotate-half position -> stored row
    out = dict(tensors)
    for name, tensor in tensors.items():
        if not re.search(r"\.self_attn\.[qk]_proj\.(weight|bias)$", name):
            continue
        heads = tensor.shape[0] // d
        out[name] = tensor.reshape(heads, d, *tensor.shape[1:])[:, order].reshape(tensor.shape).contiguous()
    return out
