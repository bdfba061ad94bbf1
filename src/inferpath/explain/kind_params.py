"""Parameters of layers of several kinds (config_kinds.py), per weight-bearing stage.

A DeepSeek-V3 layer is latent attention with a dense FFN (the first three) or experts (the
rest); a Qwen3-Next layer is Gated DeltaNet or gated full attention, each with experts.
``stage_params`` gives one layer's parameters under the cost model's stage names, so the
stage table (explain/layer_cost.py) and the weight totals (``kinds_weight_breakdown``) count
the same parameters.

Invariant: ``total == embedding + sum(count x layer params over kinds) + final_norm + head``;
the absorbed (decode) and expanded (prefill) forms of MLA hold the same parameters (W_UK
and W_UV are kv_b_proj's two halves).
"""

from __future__ import annotations

from inferpath.config import ModelConfig
from inferpath.config_kinds import (
    LayerKind,
    layer_kinds,
    linear_conv_dim,
    linear_key_dim,
    linear_value_dim,
    shared_expert_size,
)

# stages whose parameters are experts (a token uses num_experts_per_tok / num_experts of them)
EXPERT_STAGES = ("gate_proj", "up_proj", "down_proj")
ATTENTION_NORMS = ("rmsnorm_attn", "rmsnorm_ffn")


def ffn_prefix(config: ModelConfig) -> str:
    """Dense FFN stages of a model that also has MoE layers are named dense_*."""
    return "dense_" if config.is_moe else ""


def mla_dims(config: ModelConfig) -> tuple[int, int, int, int, int, int]:
    """(heads, q_lora_rank, kv_lora_rank, rope dim, nope dim, value dim)."""
    return (config.num_heads, config.q_lora_rank, config.kv_lora_rank, config.qk_rope_head_dim,
            config.qk_nope_head_dim, config.v_head_dim)


def attention_params(config: ModelConfig, kind: LayerKind, absorbed: bool) -> dict[str, int]:
    h = config.hidden_size
    if kind.attention == "mla":
        heads, qr, r, p, n, v = mla_dims(config)
        out = ({"q_a_proj": h * qr, "q_a_norm": qr, "q_b_proj": qr * heads * (n + p)} if qr
               else {"q_proj": h * heads * (n + p)})
        out |= {"kv_a_proj": h * (r + p), "kv_a_norm": r}
        out |= {"q_absorb": heads * n * r, "v_up": heads * v * r} if absorbed else {"kv_b_proj": heads * (n + v) * r}
        return out | {"o_proj": heads * v * h}
    if kind.attention == "linear":
        kd, vd, hv = linear_key_dim(config), linear_value_dim(config), config.linear_num_value_heads
        return {"gdn_in_proj": h * (2 * kd + 2 * vd + 2 * hv),  # q, k, v, output gate z; beta, decay a
                "gdn_conv": linear_conv_dim(config) * config.linear_conv_kernel_dim,
                "gdn_gates": 2 * hv,  # A_log and dt_bias per value head
                "gdn_norm_gate": config.linear_value_head_dim, "gdn_out_proj": vd * h}
    q, kv = config.q_size, config.kv_size
    bias_q, bias_kv = (q, kv) if config.attention_bias else (0, 0)
    out = {"q_proj": h * q * (2 if config.attn_output_gate else 1) + bias_q,
           "k_proj": h * kv + bias_kv, "v_proj": h * kv + bias_kv}
    if config.qk_norm in ("head", "projection"):  # Llama 4's "l2_rope" has no weight
        out["qk_norm"] = 2 * config.head_dim if config.qk_norm == "head" else q + kv
    if config.attention_sinks:  # gpt-oss: one learned logit per head in each softmax
        out["attn_sinks"] = config.num_heads
    return out | {"o_proj": q * h + (h if config.o_proj_bias else 0)}


def ffn_params(config: ModelConfig, kind: LayerKind) -> dict[str, int]:
    h = config.hidden_size
    if kind.ffn == "dense":
        inter, pre = config.intermediate_size, ffn_prefix(config)
        bias = (inter, h) if config.mlp_bias else (0, 0)
        return {f"{pre}gate_proj": h * inter + bias[0], f"{pre}up_proj": h * inter + bias[0],
                f"{pre}down_proj": inter * h + bias[1]}
    experts, width, shared = config.num_experts, config.expert_intermediate_size, shared_expert_size(config)
    # a bias beside the router: DeepSeek's and GLM-4's correction bias (choice only), gpt-oss's logit bias
    biased = config.router_correction_bias or config.moe_router in ("sigmoid_grouped", "topk_softmax")
    router = h * experts + (experts if biased else 0)
    if config.shared_expert_intermediate_size and not config.num_shared_experts and config.moe_router == "softmax":
        router += h  # Qwen's sigmoid gate on the shared expert (GLM-4 MoE's shared experts have none)
    # gpt-oss's experts carry biases (gate/up: width each, down: hidden)
    bias = (width, h) if config.moe_router == "topk_softmax" else (0, 0)
    out = {"router": router, "gate_proj": experts * (h * width + bias[0]), "up_proj": experts * (h * width + bias[0]),
           "down_proj": experts * (width * h + bias[1])}
    if shared:
        out |= {"shared_gate_proj": h * shared, "shared_up_proj": h * shared, "shared_down_proj": shared * h}
    return out


def norm_params(config: ModelConfig) -> dict[str, int]:
    """A layer's RMSNorms by stage: before attention and the FFN (Llama); only after them,
    on their outputs (OLMo 2's post_norms); both (Gemma's sandwich)."""
    h = config.hidden_size
    pre = {} if config.post_norms else {"rmsnorm_attn": h, "rmsnorm_ffn": h}
    post = {"post_attn_norm": h, "post_ffn_norm": h} if config.post_norms or config.sandwich_norms else {}
    return pre | post


def stage_params(config: ModelConfig, kind: LayerKind, absorbed: bool = True) -> dict[str, int]:
    """One layer's parameters by stage name, its RMSNorms included."""
    return {**norm_params(config), **attention_params(config, kind, absorbed), **ffn_params(config, kind)}


def active_params(config: ModelConfig, kind: LayerKind) -> int:
    """Parameters one token runs through: num_experts_per_tok of the routed experts."""
    params = stage_params(config, kind)
    if kind.ffn != "moe":
        return sum(params.values())
    share = config.num_experts_per_tok / config.num_experts
    return round(sum(p * share if name in EXPERT_STAGES else p for name, p in params.items()))


def kinds_weight_breakdown(config: ModelConfig, weight_bytes_per_param: float):
    """params.WeightBreakdown for a model whose layers differ; per_layer_params is the mean
    over the layers (``layer_groups`` says what each kind holds)."""
    from inferpath.explain.params import WeightBreakdown

    embedding = config.vocab_size * config.hidden_size
    head = 0 if config.tie_word_embeddings else embedding
    layers = total_layers = active = attention = ffn = 0
    groups = []
    for kind, count in layer_kinds(config):
        params = stage_params(config, kind)
        per_layer = sum(params.values())
        attn = sum(attention_params(config, kind, True).values())
        groups.append((describe(config, kind), count, per_layer))
        total_layers += count * per_layer
        active += count * active_params(config, kind)
        attention += count * attn
        ffn += count * sum(ffn_params(config, kind).values())
        layers += count
    return WeightBreakdown(
        weight_bytes_per_param=weight_bytes_per_param, embedding_params=embedding,
        per_layer_params=total_layers // layers, num_layers=layers, final_norm_params=config.hidden_size,
        head_params=head, attention_params_per_layer=attention // layers, ffn_params_per_layer=ffn // layers,
        total_params=embedding + total_layers + config.hidden_size + head,
        active_params=embedding + active + config.hidden_size + head,
        layer_groups=tuple(groups), layers_params=total_layers,
    )


def describe(config: ModelConfig, kind: LayerKind) -> str:
    """e.g. "MLA + MoE", "Gated DeltaNet + MoE", "attention + dense FFN"."""
    attention = {"mla": "MLA", "linear": "Gated DeltaNet", "gqa": "attention"}[kind.attention]
    if kind.window:
        attention += f" (window {kind.window})"
    return f"{attention} + {'MoE' if kind.ffn == 'moe' else 'dense FFN'}"
