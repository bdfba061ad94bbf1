"""Which token mixer a layer has, under the name its checkpoint uses.

Most layers attend (``self_attn``: grouped-query attention, DeepSeek's latent attention, or
Qwen3-Next's gated attention); Qwen3-Next's linear layers run a Gated DeltaNet
(``linear_attn``). Every mixer is called as ``mixer(positions, x, kv_cache, plans)``.
"""

from __future__ import annotations

from torch import nn

from inferpath.config import ModelConfig
from inferpath.model.rope import RopeTable


def token_mixer(config: ModelConfig, layer_idx: int, rope_table: RopeTable) -> tuple[str, nn.Module]:
    """(attribute name, module) of layer ``layer_idx``'s mixer."""
    if config.is_linear_attention_layer(layer_idx):
        from inferpath.model.gated_deltanet import GatedDeltaNet

        return "linear_attn", GatedDeltaNet(config, layer_idx)
    if config.is_mla:
        from inferpath.model.mla import MLASelfAttention

        return "self_attn", MLASelfAttention(config, layer_idx, rope_table)
    if config.attn_output_gate:
        from inferpath.model.qwen3_next import GatedSelfAttention

        return "self_attn", GatedSelfAttention(config, layer_idx, rope_table)
    from inferpath.model.self_attention import SelfAttention

    return "self_attn", SelfAttention(config, layer_idx, rope_table)
