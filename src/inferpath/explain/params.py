"""Parameter counts and weight bytes of a ModelConfig, by component.

The seed's "directory of numbers": an embedding table, ``num_layers`` identical layers and
an output projection (absent when tied to the embedding). A MoE layer holds every expert
(total parameters) but runs only ``num_experts_per_tok`` of them per token (active).

Invariant: ``total_params == embedding + num_layers * per_layer + final_norm + head``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from inferpath.config import ModelConfig


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one layer, per weight-bearing operation."""

    input_norm: int
    q_proj: int  # including the bias when the model has one (Qwen2)
    k_proj: int
    v_proj: int
    o_proj: int
    post_attention_norm: int
    router: int  # MoE gate (hidden -> num_experts); 0 for a dense FFN
    gate_proj: int  # all experts for MoE
    up_proj: int
    down_proj: int
    active_ffn: int  # FFN parameters one token runs through (== ffn when dense)

    @property
    def attention(self) -> int:
        return self.q_proj + self.k_proj + self.v_proj + self.o_proj

    @property
    def ffn(self) -> int:
        return self.router + self.gate_proj + self.up_proj + self.down_proj

    @property
    def norms(self) -> int:
        return self.input_norm + self.post_attention_norm

    @property
    def total(self) -> int:
        return self.attention + self.ffn + self.norms

    @property
    def active(self) -> int:
        return self.attention + self.active_ffn + self.norms


def layer_params(config: ModelConfig) -> LayerParams:
    h, inter = config.hidden_size, config.intermediate_size
    bias_q = config.q_size if config.attention_bias else 0
    bias_kv = config.kv_size if config.attention_bias else 0
    experts = config.num_experts or 1
    expert_ffn = 3 * h * inter
    router = h * config.num_experts if config.is_moe else 0
    active = router + expert_ffn * (config.num_experts_per_tok if config.is_moe else 1)
    return LayerParams(
        input_norm=h,
        q_proj=h * config.q_size + bias_q,
        k_proj=h * config.kv_size + bias_kv,
        v_proj=h * config.kv_size + bias_kv,
        o_proj=config.q_size * h,
        post_attention_norm=h,
        router=router,
        gate_proj=experts * h * inter,
        up_proj=experts * h * inter,
        down_proj=experts * inter * h,
        active_ffn=active,
    )


@dataclass(frozen=True)
class WeightBreakdown:
    """Where the weights are, in parameters and in bytes at ``weight_bytes_per_param``."""

    weight_bytes_per_param: float
    embedding_params: int
    per_layer_params: int
    num_layers: int
    final_norm_params: int
    head_params: int  # 0 when the LM head is tied to the embedding table
    attention_params_per_layer: int
    ffn_params_per_layer: int
    total_params: int
    active_params: int  # per token; == total_params for a dense model
    # layers of several kinds (explain/kind_params.py): (kind, number of layers, parameters
    # each), and all layers' parameters; per_layer_params is then their mean
    layer_groups: tuple[tuple[str, int, int], ...] = ()
    layers_params: int = 0

    @property
    def embedding_bytes(self) -> float:
        return self.embedding_params * self.weight_bytes_per_param

    @property
    def per_layer_bytes(self) -> float:
        return self.per_layer_params * self.weight_bytes_per_param

    @property
    def layers_bytes(self) -> float:
        if self.layers_params:
            return self.layers_params * self.weight_bytes_per_param
        return self.per_layer_bytes * self.num_layers

    @property
    def head_bytes(self) -> float:
        return self.head_params * self.weight_bytes_per_param

    @property
    def total_bytes(self) -> float:
        return self.total_params * self.weight_bytes_per_param

    @property
    def ffn_share(self) -> float:
        """FFN's share of the layer's weight-bearing (attention + FFN) parameters."""
        return self.ffn_params_per_layer / (self.ffn_params_per_layer + self.attention_params_per_layer)

    @property
    def attention_share(self) -> float:
        return 1.0 - self.ffn_share

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("embedding_bytes", "per_layer_bytes", "layers_bytes", "head_bytes",
                     "total_bytes", "ffn_share", "attention_share"):
            d[name] = getattr(self, name)
        return d


def weight_breakdown(config: ModelConfig, weight_bytes_per_param: float) -> WeightBreakdown:
    from inferpath.explain.layer_cost import priced_by_kind

    if priced_by_kind(config):  # layers differ (MLA, dense + MoE, linear attention), or family stages
        from inferpath.explain.kind_params import kinds_weight_breakdown

        return kinds_weight_breakdown(config, weight_bytes_per_param)
    layer = layer_params(config)
    embedding = config.vocab_size * config.hidden_size
    head = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    final_norm = config.hidden_size
    total = embedding + config.num_layers * layer.total + final_norm + head
    # A token reads one embedding row, but "active parameters" conventionally counts the
    # whole table (as Mixtral's 12.9B does); only the experts are discounted.
    active = embedding + config.num_layers * layer.active + final_norm + head
    return WeightBreakdown(
        weight_bytes_per_param=weight_bytes_per_param,
        embedding_params=embedding,
        per_layer_params=layer.total,
        num_layers=config.num_layers,
        final_norm_params=final_norm,
        head_params=head,
        attention_params_per_layer=layer.attention,
        ffn_params_per_layer=layer.ffn,
        total_params=total,
        active_params=active,
    )
