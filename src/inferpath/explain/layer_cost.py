"""The cost of a pass through layers of several kinds: latent attention, Gated DeltaNet, dense
and MoE FFNs, shared experts. cost.pass_cost hands such models here (config_kinds.py).

Each kind of layer is priced as cost.py prices a Llama layer (same conventions: one kernel a
stage, weights read once a pass, bf16 activations and cache, fp32 scores, experts touched
under uniform routing), then multiplied by the number of layers of that kind; stages of the
same name in several kinds (the norms, the residual adds) are one kernel shape and add up.

Latent attention (MLA). A token caches c = kv_lora_rank latent values and one RoPE key of
qk_rope_head_dim values shared by all heads. A decode step (one new token a sequence) runs
the absorbed form: q_absorb folds W_UK into each head's query (nope part -> latent space),
attn_scores dots it with the cached latents and RoPE keys, attn_weighted_sum sums latents,
v_up applies W_UV; the cache is read once for all heads, never expanded. A pass of several
tokens (prefill, chunks) runs the expanded form: kv_b_proj up-projects every cached latent
of the context to per-head keys and values, then attention is ordinary multi-head attention.

Gated DeltaNet (Qwen3-Next's linear layers). In-projections (q, k, v, the output gate z,
beta and the decay input a), a depthwise causal convolution of kernel K over the q/k/v
channels (its state: the last K-1 inputs), q/k L2 norms and the gates, the delta-rule
recurrence over a (key dim x value dim) state per value head (read and written once a pass
for every sequence), a gated RMSNorm, out_proj. FLOPs of the recurrence per token and value
head: 7 dk dv in the recurrent form (decay, read-out, rank-one update, query read-out) when
one token a sequence is new; 6 dk dv + 2 c (2 dk + dv) in the chunked form otherwise, c =
min(64, new tokens) (the chunk's own attention and WY products; an estimate).

Invariant (tests): the pass's totals are the sums of its stages, and its stages hold every
parameter of kind_params.stage_params exactly once.
"""

from __future__ import annotations

from collections import defaultdict

from inferpath.config import ModelConfig
from inferpath.config_kinds import (
    LayerKind,
    layer_kinds,
    linear_conv_dim,
    linear_key_dim,
    linear_value_dim,
    shared_expert_size,
)
from inferpath.explain.kind_params import ffn_prefix, stage_params

CHUNK = 64  # the chunked delta rule's chunk length (transformers' and FLA's)
STAGE_ORDER = (
    "tokenize", "embedding", "embedding_scale", "rmsnorm_attn",
    "q_proj", "k_proj", "v_proj", "qk_norm",  # attention (GQA)
    "q_a_proj", "q_a_norm", "q_b_proj", "kv_a_proj", "kv_a_norm",  # MLA's low-rank projections
    "rope", "kv_write", "q_absorb", "kv_b_proj", "attn_scores", "softmax", "attn_sinks", "attn_weighted_sum",
    "v_up", "attn_gate",
    "gdn_in_proj", "gdn_conv", "gdn_gates", "gdn_recurrence", "gdn_norm_gate", "gdn_out_proj",
    "o_proj", "post_attn_norm", "residual_scale", "residual_attn", "rmsnorm_ffn",
    "dense_gate_proj", "dense_up_proj", "dense_silu_mul", "dense_down_proj",
    "router", "gate_proj", "up_proj", "silu_mul", "down_proj",
    "shared_gate_proj", "shared_up_proj", "shared_silu_mul", "shared_down_proj",
    "post_ffn_norm", "residual_ffn", "final_norm", "lm_head", "logit_scale", "logit_softcap", "sampling",
)


def priced_by_kind(config: ModelConfig) -> bool:
    """True when a model's layers differ (config_kinds.has_layer_kinds) or carry a stage the
    one-layer Llama table of cost.py has no row for: QK norms (Qwen3, OLMo 2, Gemma 3),
    attention sinks (gpt-oss), sliding and full layers mixed (Gemma 2/3, gpt-oss), norms
    after attention and the FFN (OLMo 2, Gemma), Granite's and Gemma's multipliers, logit
    soft-capping, layers without RoPE (SmolLM3), partial rotary (GLM-4), biased routers and
    experts (gpt-oss, GLM-4 MoE), MLP biases."""
    from inferpath.config_kinds import has_layer_kinds

    return bool(has_layer_kinds(config) or config.qk_norm or config.attention_sinks or config.layer_types
                or config.sandwich_norms or config.post_norms or config.embedding_multiplier != 1.0
                or config.residual_multiplier != 1.0 or config.logits_scaling != 1.0
                or config.final_logit_softcapping or config.attn_logit_softcapping or config.no_rope_layers
                or config.rotary_dim or config.moe_router != "softmax" or config.mlp_bias)


class _Pass:
    """The shapes and byte sizes of one pass, and the per-layer stages gathered so far."""

    def __init__(self, config, precision, num_new_tokens, context_len, batch, fused_attention):
        self.config, self.T, self.C, self.B = config, num_new_tokens, context_len, batch
        self.N = num_new_tokens * batch
        self.wb, self.ab, self.kvb = precision.weight_bytes, precision.activation_bytes, precision.kv_bytes
        self.fused = fused_attention
        # name -> [count, params, weight bytes, bytes read, bytes written, FLOPs]
        self.rows: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0, 0.0, 0.0])
        self.params: dict[str, int] = {}

    def add(self, name, count, read, written, flops, weights_params=None):
        """``count`` instances of a stage; ``weights_params`` = parameters read (default: all)."""
        params = self.params.get(name, 0)
        weights = (params if weights_params is None else weights_params) * self.wb
        row = self.rows[name]
        for i, value in enumerate((count, params * count, weights * count, (read + weights) * count,
                                   written * count, flops * count)):
            row[i] += value

    def linear(self, name, count, d_in, d_out):
        self.add(name, count, self.N * d_in * self.ab, self.N * d_out * self.ab, 2 * self.params[name] * self.N)

    def norm(self, name, count, width):
        self.add(name, count, self.N * width * self.ab, self.N * width * self.ab, 4 * self.N * width)


def _gqa(ps: _Pass, kind: LayerKind, count: int) -> None:
    from inferpath.explain.cost import FP32, attention_pairs

    c, N, B, ab, kvb = ps.config, ps.N, ps.B, ps.ab, ps.kvb
    h, q, kv, heads, hd = c.hidden_size, c.q_size, c.kv_size, c.num_heads, c.head_dim
    gate = 2 if c.attn_output_gate else 1
    bias = (q, kv) if c.attention_bias else (0, 0)
    ps.add("q_proj", count, N * h * ab, N * q * gate * ab, 2 * N * h * q * gate + N * bias[0])
    for name in ("k_proj", "v_proj"):
        ps.add(name, count, N * h * ab, N * kv * ab, 2 * N * h * kv + N * bias[1])
    if c.qk_norm:
        ps.norm("qk_norm", count, q + kv)
    share = c.rotary_dim / c.head_dim if c.rotary_dim else c.partial_rotary_factor
    rotary = round((q + kv) * share)
    ps.add("rope", count, N * rotary * ab, N * rotary * ab, 3 * N * rotary)
    ps.add("kv_write", count, 2 * N * kv * ab, 2 * N * kv * kvb, 0)
    window = kind.window or None
    pairs = B * attention_pairs(ps.T, ps.C, window)
    keys_read = B * min(ps.C, (window or ps.C) + ps.T - 1) * kv * kvb
    scores = 0 if ps.fused else pairs * heads * FP32
    ps.add("attn_scores", count, N * q * ab + keys_read, scores, 2 * pairs * heads * hd + pairs * heads)
    capped = 3 * pairs * heads if c.attn_logit_softcapping else 0  # cap * tanh(score / cap) on every score
    ps.add("softmax", count, scores, scores, 5 * pairs * heads + capped)
    if c.attention_sinks:  # each head's sink logit joins the max and the denominator of every query row
        ps.add("attn_sinks", count, N * heads * FP32, N * heads * FP32, 3 * N * heads)
    ps.add("attn_weighted_sum", count, scores + keys_read, N * q * ab, 2 * pairs * heads * hd)
    if c.attn_output_gate:  # output x sigmoid(gate)
        ps.add("attn_gate", count, 2 * N * q * ab, N * q * ab, 5 * N * q)
    ps.add("o_proj", count, N * q * ab, N * h * ab, 2 * N * q * h + (N * h if c.o_proj_bias else 0))


def _mla(ps: _Pass, count: int) -> None:
    from inferpath.explain.cost import FP32, attention_pairs

    c, N, B, C, ab, kvb = ps.config, ps.N, ps.B, ps.C, ps.ab, ps.kvb
    h, heads, qr, r, p, n, v = c.hidden_size, c.num_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim, \
        c.qk_nope_head_dim, c.v_head_dim
    if qr:
        ps.linear("q_a_proj", count, h, qr)
        ps.norm("q_a_norm", count, qr)
        ps.linear("q_b_proj", count, qr, heads * (n + p))
    else:
        ps.linear("q_proj", count, h, heads * (n + p))
    ps.linear("kv_a_proj", count, h, r + p)
    ps.norm("kv_a_norm", count, r)
    ps.add("rope", count, N * (heads + 1) * p * ab, N * (heads + 1) * p * ab, 3 * N * (heads + 1) * p)
    ps.add("kv_write", count, N * (r + p) * ab, N * (r + p) * kvb, 0)
    pairs = B * attention_pairs(ps.T, C, None)  # per head
    scores = 0 if ps.fused else pairs * heads * FP32
    if ps.T == 1:  # absorbed: scores against the latents, read once for every head
        ps.linear("q_absorb", count, heads * n, heads * r)
        ps.add("attn_scores", count, N * heads * (r + p) * ab + B * C * (r + p) * kvb, scores,
               2 * pairs * heads * (r + p) + pairs * heads)
        ps.add("softmax", count, scores, scores, 5 * pairs * heads)
        ps.add("attn_weighted_sum", count, scores + B * C * r * kvb, N * heads * r * ab, 2 * pairs * heads * r)
        ps.linear("v_up", count, heads * r, heads * v)
    else:  # expanded: every cached latent of the context up-projected to per-head K and V
        ps.add("kv_b_proj", count, B * C * r * kvb, B * C * heads * (n + v) * ab,
               2 * B * C * r * heads * (n + v))
        ps.add("attn_scores", count, N * heads * (n + p) * ab + B * C * (heads * n * ab + p * kvb), scores,
               2 * pairs * heads * (n + p) + pairs * heads)
        ps.add("softmax", count, scores, scores, 5 * pairs * heads)
        ps.add("attn_weighted_sum", count, scores + B * C * heads * v * ab, N * heads * v * ab,
               2 * pairs * heads * v)
    ps.linear("o_proj", count, heads * v, h)


def _gated_deltanet(ps: _Pass, count: int) -> None:
    from inferpath.explain.cost import FP32

    c, N, B, ab, sb = ps.config, ps.N, ps.B, ps.ab, ps.kvb
    h, kd, vd, hv = c.hidden_size, linear_key_dim(c), linear_value_dim(c), c.linear_num_value_heads
    dk, dv, kernel, conv = c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim, linear_conv_dim(c)
    ps.linear("gdn_in_proj", count, h, 2 * kd + 2 * vd + 2 * hv)
    conv_state = B * conv * (kernel - 1) * sb
    ps.add("gdn_conv", count, N * conv * ab + conv_state, N * conv * ab + conv_state, N * conv * (2 * kernel + 4))
    ps.add("gdn_gates", count, N * (2 * kd + 2 * hv) * ab, N * 2 * kd * ab + N * 2 * hv * FP32,
           N * (6 * kd + 12 * hv))
    state = B * hv * dk * dv * sb
    per_head = 7 * dk * dv if ps.T == 1 else 6 * dk * dv + 2 * min(CHUNK, ps.T) * (2 * dk + dv)
    ps.add("gdn_recurrence", count, N * (2 * kd + vd) * ab + N * 2 * hv * FP32 + state, N * vd * ab + state,
           N * hv * per_head)
    ps.add("gdn_norm_gate", count, 2 * N * vd * ab, N * vd * ab, 9 * N * vd)
    ps.linear("gdn_out_proj", count, vd, h)


def _ffn(ps: _Pass, kind: LayerKind, count: int) -> None:
    from inferpath.explain.cost import FP32

    c, N, ab = ps.config, ps.N, ps.ab
    h = c.hidden_size
    if kind.ffn == "dense":
        pre, inter = ffn_prefix(c), c.intermediate_size
        ps.linear(f"{pre}gate_proj", count, h, inter)
        ps.linear(f"{pre}up_proj", count, h, inter)
        ps.add(f"{pre}silu_mul", count, 2 * N * inter * ab, N * inter * ab, 5 * N * inter)
        ps.linear(f"{pre}down_proj", count, inter, h)
        return
    E, k, width = c.num_experts, c.num_experts_per_tok, c.expert_intermediate_size
    touched = E * (1.0 - (1.0 - k / E) ** N)
    expert = h * width
    ps.add("router", count, N * h * ab, N * E * FP32, 2 * ps.params["router"] * N + 5 * N * E)
    ps.add("gate_proj", count, N * h * ab, N * k * width * ab, 2 * N * k * expert, touched * expert)
    ps.add("up_proj", count, N * h * ab, N * k * width * ab, 2 * N * k * expert, touched * expert)
    ps.add("silu_mul", count, 2 * N * k * width * ab, N * k * width * ab, 5 * N * k * width)
    ps.add("down_proj", count, N * k * width * ab, N * h * ab, 2 * N * k * expert + 2 * N * k * h, touched * expert)
    shared = shared_expert_size(c)
    if shared:
        ps.linear("shared_gate_proj", count, h, shared)
        ps.linear("shared_up_proj", count, h, shared)
        ps.add("shared_silu_mul", count, 2 * N * shared * ab, N * shared * ab, 5 * N * shared)
        ps.add("shared_down_proj", count, N * shared * ab, N * h * ab, 2 * N * shared * h + 2 * N * h)  # + the add


def kinds_pass_cost(config: ModelConfig, hardware, precision, num_new_tokens: int, context_len: int,
                    batch: int = 1, fused_attention: bool = False):
    """cost.pass_cost for a model whose layers differ (same arguments, same PassCost)."""
    from inferpath.explain.cost import FP32, TOKEN_ID, PassCost, StageCost

    ps = _Pass(config, precision, num_new_tokens, context_len, batch, fused_attention)
    h, vocab, N, B, ab, wb = config.hidden_size, config.vocab_size, ps.N, ps.B, ps.ab, ps.wb
    starts_request = num_new_tokens == context_len
    pre_norms = not config.post_norms
    post_norms = config.post_norms or config.sandwich_norms
    for kind, count in layer_kinds(config):
        ps.params = stage_params(config, kind, absorbed=num_new_tokens == 1)
        if pre_norms:
            ps.norm("rmsnorm_attn", count, h)
        {"mla": lambda: _mla(ps, count), "linear": lambda: _gated_deltanet(ps, count),
         "gqa": lambda: _gqa(ps, kind, count)}[kind.attention]()
        if post_norms:
            ps.norm("post_attn_norm", count, h)
        if config.residual_multiplier != 1.0:  # Granite: both blocks' outputs scaled before their adds
            ps.add("residual_scale", count, 2 * N * h * ab, 2 * N * h * ab, 2 * N * h)
        ps.add("residual_attn", count, 2 * N * h * ab, N * h * ab, N * h)
        if pre_norms:
            ps.norm("rmsnorm_ffn", count, h)
        _ffn(ps, kind, count)
        if post_norms:
            ps.norm("post_ffn_norm", count, h)
        ps.add("residual_ffn", count, 2 * N * h * ab, N * h * ab, N * h)
    if config.no_rope_layers and "rope" in ps.rows:  # SmolLM3: those layers rotate nothing
        rope, skipped = ps.rows["rope"], len(config.no_rope_layers)
        kept = (rope[0] - skipped) / rope[0]
        ps.rows["rope"] = [rope[0] - skipped, rope[1], rope[2], rope[3] * kept, rope[4] * kept, rope[5] * kept]
    ps.params = {"embedding": vocab * h, "final_norm": h, "lm_head": vocab * h, "embedding_scale": 0,
                 "logit_scale": 0, "logit_softcap": 0}
    if starts_request:
        ps.params["tokenize"] = 0
        ps.add("tokenize", 1, 0, 0, 0)
    ps.add("embedding", 1, N * TOKEN_ID, N * h * ab, 0, N * h)  # one row read per token
    if config.embedding_multiplier != 1.0:  # Gemma's sqrt(hidden), Granite's embedding_multiplier
        ps.add("embedding_scale", 1, N * h * ab, N * h * ab, N * h)
    ps.norm("final_norm", 1, h)
    ps.add("lm_head", 1, B * h * ab, B * vocab * FP32, 2 * B * h * vocab)
    if config.logits_scaling != 1.0:  # Granite: logits / logits_scaling
        ps.add("logit_scale", 1, B * vocab * FP32, B * vocab * FP32, B * vocab)
    if config.final_logit_softcapping:  # Gemma 2: cap * tanh(logits / cap)
        ps.add("logit_softcap", 1, B * vocab * FP32, B * vocab * FP32, 3 * B * vocab)
    ps.params["sampling"] = 0
    ps.add("sampling", 1, B * vocab * FP32, B * TOKEN_ID, 5 * B * vocab)
    peak, bw = hardware.flops_for(precision.compute_dtype), hardware.memory_bandwidth
    stages = []
    for name in STAGE_ORDER:
        if name not in ps.rows:
            continue
        count, params, weights, read, written, flops = ps.rows[name]
        host = name == "tokenize"
        stages.append(StageCost(name=name, count=int(count), params=int(params), weight_bytes=weights,
                                bytes_read=read, bytes_written=written, flops=flops,
                                compute_time_s=0.0 if host else flops / peak,
                                memory_time_s=0.0 if host else (read + written) / bw, on_accelerator=not host))
    missing = set(ps.rows) - set(STAGE_ORDER)
    assert not missing, f"stages {sorted(missing)} have no place in STAGE_ORDER"
    return PassCost(phase="prefill" if num_new_tokens > 1 or starts_request else "decode", batch=B,
                    num_new_tokens=num_new_tokens, context_len=context_len, stages=tuple(stages),
                    weight_bytes_per_param=wb)
