"""The per-stage cost model: what one forward pass reads, writes and computes, per stage.

A pass computes ``num_new_tokens`` new tokens for each of ``batch`` identical sequences
whose context is ``context_len`` tokens after the pass. Prefill is a pass with
``num_new_tokens == context_len == prompt length``; a decode step is a pass of one token.

Conventions (documented so the numbers can be checked by hand):
- Each stage is one kernel that reads its inputs from memory and writes its outputs back;
  its time is ``max(FLOPs / peak, bytes / bandwidth)`` and the pass time is the sum over
  stages (no overlap between kernels). The bound is whichever term is larger.
- Weights (all parameters, norms included, at the weight dtype) are read once per pass,
  however many tokens use them. Weight-only int8/int4
  dequantize to bf16 in the matmul (bf16 peak). Quantization scales are not counted.
  The dtypes and their sizes are a ``Precision`` (explain/precision.py).
- Activations and the KV cache are bf16 (fp32 when the weights are fp32); attention scores
  and probabilities, logits and the RMSNorm statistics are fp32.
- Attention is the unfused reference path (scores -> softmax -> weighted sum, each through
  memory), the one the eager model runs. ``fused_attention=True`` models a FlashAttention
  kernel instead: the scores never reach memory, so softmax moves no bytes.
- Only the last position of each sequence reaches the LM head and the sampler (Stage 5).
- Per-layer stages have ``count == num_layers``; their numbers are totals over the layers.
- tokenize runs on the host before the first kernel: it appears in prefill with no
  accelerator bytes, FLOPs or time; the ids it produces are what the embedding reads.
- RoPE's cos/sin tables are not counted (precomputed, and small against Q and K).
- MoE: the weights read are the experts the pass's tokens touch, expected under uniform
  routing: ``E * (1 - (1 - k/E) ** num_tokens)``; FLOPs count ``k`` experts per token.
- Layers of several kinds (latent attention, linear attention, dense layers in an MoE
  model, shared experts) and the stages families add (QK norms, sinks, post norms,
  multipliers: layer_cost.priced_by_kind) are priced kind by kind in explain/layer_cost.py.
- A precision that knows each matmul stage's formats (``Precision.formats``) re-prices those
  stages at their own formats' sizes and, where the hardware was probed, their kernels'
  rates (explain/kernel_cost.py).

Invariant: a PassCost's totals are the sums of its stages (tests check it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferpath.config import ModelConfig
from inferpath.explain.hardware import HardwareSpec
from inferpath.explain.params import layer_params
from inferpath.explain.precision import DTYPE_BYTES, WIDENED_FORMATS, Precision  # noqa: F401 - re-exported

FP32 = 4  # bytes: scores, probabilities, logits
TOKEN_ID = 8  # bytes: int64 token ids

STAGE_NAMES = (
    "tokenize", "embedding", "rmsnorm_attn", "q_proj", "k_proj", "v_proj", "rope", "kv_write",
    "attn_scores", "softmax", "attn_weighted_sum", "o_proj", "residual_attn", "rmsnorm_ffn",
    "router", "gate_proj", "up_proj", "silu_mul", "down_proj", "residual_ffn", "final_norm",
    "lm_head", "sampling",
)
PER_LAYER_STAGES = frozenset(STAGE_NAMES[2:20])
# Stages whose weights are the matrices of a layer (the seed's "weight-bearing operations").
LAYER_MATMUL_STAGES = ("q_proj", "k_proj", "v_proj", "o_proj", "router", "gate_proj",
                       "up_proj", "down_proj",
                       # layers of other kinds (explain/layer_cost.py): MLA, Gated DeltaNet,
                       # the dense FFN of an MoE model, shared experts
                       "q_a_proj", "q_b_proj", "kv_a_proj", "q_absorb", "kv_b_proj", "v_up",
                       "gdn_in_proj", "gdn_out_proj", "dense_gate_proj", "dense_up_proj",
                       "dense_down_proj", "shared_gate_proj", "shared_up_proj", "shared_down_proj")


@dataclass(frozen=True)
class StageCost:
    """One stage of one pass: parameters used, bytes moved, FLOPs, and its time both ways."""

    name: str
    count: int  # kernel instances in the pass (num_layers for per-layer stages)
    params: int  # parameters the stage uses (over all instances)
    weight_bytes: float  # part of bytes_read that is weights
    bytes_read: float
    bytes_written: float
    flops: float
    compute_time_s: float  # time if compute-bound: flops / peak
    memory_time_s: float  # time if memory-bound: bytes / bandwidth
    on_accelerator: bool = True

    @property
    def bytes_moved(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved (0 for a stage that moves nothing)."""
        return self.flops / self.bytes_moved if self.bytes_moved else 0.0

    @property
    def time_s(self) -> float:
        return max(self.compute_time_s, self.memory_time_s)

    @property
    def bound(self) -> str:
        if not self.on_accelerator:
            return "host"
        return "compute" if self.compute_time_s > self.memory_time_s else "memory"

    def to_dict(self) -> dict:
        return {
            "name": self.name, "count": self.count, "params": self.params,
            "weight_bytes": self.weight_bytes, "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written, "flops": self.flops,
            "intensity": self.intensity, "compute_time_s": self.compute_time_s,
            "memory_time_s": self.memory_time_s, "time_s": self.time_s, "bound": self.bound,
        }


@dataclass(frozen=True)
class PassCost:
    """One forward pass (prefill or one decode step) as a list of stages."""

    phase: str  # "prefill" or "decode"
    batch: int
    num_new_tokens: int  # per sequence
    context_len: int  # per sequence, after the pass
    stages: tuple[StageCost, ...]
    weight_bytes_per_param: float

    def stage(self, name: str) -> StageCost:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"no stage {name!r} in this pass; stages: {[s.name for s in self.stages]}")

    def _sum(self, attr: str) -> float:
        return sum(getattr(s, attr) for s in self.stages)

    flops = property(lambda self: self._sum("flops"))
    bytes_read = property(lambda self: self._sum("bytes_read"))
    bytes_written = property(lambda self: self._sum("bytes_written"))
    weight_bytes = property(lambda self: self._sum("weight_bytes"))
    time_s = property(lambda self: self._sum("time_s"))
    compute_time_s = property(lambda self: self._sum("compute_time_s"))
    memory_time_s = property(lambda self: self._sum("memory_time_s"))

    @property
    def bytes_moved(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_moved

    @property
    def bound(self) -> str:
        """Which bound holds for most of the pass's time."""
        compute = sum(s.time_s for s in self.stages if s.bound == "compute")
        return "compute" if compute > self.time_s / 2 else "memory"

    @property
    def layer_matmul_flops_per_param(self) -> float:
        """FLOPs per weight parameter over the layers' matrices: 2 x tokens when dense.

        This is what the seed calls "FLOPs per byte" (14 for 7 tokens): it is per byte
        only for 1-byte weights; in bf16 it is twice the per-byte intensity.
        """
        stages = [s for s in self.stages if s.name in LAYER_MATMUL_STAGES]
        params_read = sum(s.weight_bytes for s in stages) / self.weight_bytes_per_param
        return sum(s.flops for s in stages) / params_read

    @property
    def layer_matmul_intensity(self) -> float:
        """FLOPs per byte moved (weights and activations) by the layers' matrices."""
        stages = [s for s in self.stages if s.name in LAYER_MATMUL_STAGES]
        return sum(s.flops for s in stages) / sum(s.bytes_moved for s in stages)

    def to_dict(self) -> dict:
        return {
            "phase": self.phase, "batch": self.batch, "num_new_tokens": self.num_new_tokens,
            "context_len": self.context_len, "flops": self.flops, "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written, "weight_bytes": self.weight_bytes,
            "intensity": self.intensity, "time_s": self.time_s, "bound": self.bound,
            "layer_matmul_flops_per_param": self.layer_matmul_flops_per_param,
            "stages": [s.to_dict() for s in self.stages],
        }


def attention_pairs(num_new_tokens: int, context_len: int, window: int | None) -> int:
    """(query, key) pairs under the causal mask: query at position p sees min(p, window) keys."""
    first, last = context_len - num_new_tokens + 1, context_len  # 1-based positions

    def capped_sum(lo: int, hi: int) -> int:  # sum of min(p, window) for p in lo..hi
        if hi < lo:
            return 0
        if window is None or hi <= window:
            return (lo + hi) * (hi - lo + 1) // 2
        if lo > window:
            return window * (hi - lo + 1)
        return capped_sum(lo, window) + window * (hi - window)

    return capped_sum(first, last)


def pass_cost(config: ModelConfig, hardware: HardwareSpec, precision: Precision,
              num_new_tokens: int, context_len: int, batch: int = 1,
              fused_attention: bool = False, by_kernel: bool = True) -> PassCost:
    """Cost of one pass; ``num_new_tokens == context_len`` is a prefill from empty.

    ``by_kernel``: matmul stages whose formats the precision knows are priced at their
    kernels' rates (explain/kernel_cost.py); False leaves that to the caller (a step of
    several chunks merges first)."""
    if not 1 <= num_new_tokens <= context_len:
        raise ValueError(f"need 1 <= num_new_tokens ({num_new_tokens}) <= context_len ({context_len})")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    from inferpath.explain.layer_cost import priced_by_kind

    if priced_by_kind(config):  # MLA, linear attention, family stages (QK norm, sinks...): kind by kind
        from inferpath.explain.layer_cost import kinds_pass_cost

        cost = kinds_pass_cost(config, hardware, precision, num_new_tokens, context_len, batch, fused_attention)
        return _by_kernel(cost, precision, hardware) if by_kernel else cost
    peak = hardware.flops_for(precision.compute_dtype)
    bw = hardware.memory_bandwidth
    wb, ab, kvb = precision.weight_bytes, precision.activation_bytes, precision.kv_bytes
    h, q, kv, inter = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    heads, hd, vocab, L = config.num_heads, config.head_dim, config.vocab_size, config.num_layers
    lp = layer_params(config)
    T, B = num_new_tokens, batch
    N = T * B  # tokens in the pass
    stages: list[StageCost] = []

    def add(name, count, params, weights, read, written, flops, on_accelerator=True):
        read += weights
        stages.append(StageCost(
            name=name, count=count, params=params * count, weight_bytes=weights * count,
            bytes_read=read * count, bytes_written=written * count, flops=flops * count,
            compute_time_s=flops * count / peak if on_accelerator else 0.0,
            memory_time_s=(read + written) * count / bw if on_accelerator else 0.0,
            on_accelerator=on_accelerator,
        ))

    def linear(name, params, d_in, d_out, bias=0):  # per layer; bias elements included in params
        add(name, L, params, params * wb, N * d_in * ab, N * d_out * ab, 2 * N * d_in * d_out + N * bias)

    starts_request = T == context_len  # nothing cached yet: the prompt was just tokenized
    if starts_request:
        add("tokenize", 1, 0, 0, 0, 0, 0, on_accelerator=False)
    add("embedding", 1, vocab * h, N * h * wb, N * TOKEN_ID, N * h * ab, 0)
    # --- per layer: attention half
    add("rmsnorm_attn", L, h, h * wb, N * h * ab, N * h * ab, 4 * N * h)
    linear("q_proj", lp.q_proj, h, q, q if config.attention_bias else 0)
    linear("k_proj", lp.k_proj, h, kv, kv if config.attention_bias else 0)
    linear("v_proj", lp.v_proj, h, kv, kv if config.attention_bias else 0)
    add("rope", L, 0, 0, N * (q + kv) * ab, N * (q + kv) * ab, 3 * N * (q + kv))
    add("kv_write", L, 0, 0, 2 * N * kv * ab, 2 * N * kv * kvb, 0)
    pairs = B * attention_pairs(T, context_len, config.sliding_window)  # per head
    window = config.sliding_window or context_len
    keys_read = B * min(context_len, window + T - 1) * kv * kvb  # K (or V) of every sequence
    scores = 0 if fused_attention else pairs * heads * FP32
    add("attn_scores", L, 0, 0, N * q * ab + keys_read, scores, 2 * pairs * heads * hd + pairs * heads)
    add("softmax", L, 0, 0, scores, scores, 5 * pairs * heads)
    add("attn_weighted_sum", L, 0, 0, scores + keys_read, N * q * ab, 2 * pairs * heads * hd)
    linear("o_proj", lp.o_proj, q, h)
    add("residual_attn", L, 0, 0, 2 * N * h * ab, N * h * ab, N * h)
    # --- per layer: FFN half
    add("rmsnorm_ffn", L, h, h * wb, N * h * ab, N * h * ab, 4 * N * h)
    if config.is_moe:
        E, k = config.num_experts, config.num_experts_per_tok
        touched = E * (1.0 - (1.0 - k / E) ** N)  # experts the pass's tokens route to
        add("router", L, lp.router, lp.router * wb, N * h * ab, N * E * FP32, 2 * N * h * E + 5 * N * E)
        expert = h * inter
        add("gate_proj", L, lp.gate_proj, touched * expert * wb, N * h * ab, N * k * inter * ab, 2 * N * k * expert)
        add("up_proj", L, lp.up_proj, touched * expert * wb, N * h * ab, N * k * inter * ab, 2 * N * k * expert)
        add("silu_mul", L, 0, 0, 2 * N * k * inter * ab, N * k * inter * ab, 5 * N * k * inter)
        # down_proj also weights and sums the k expert outputs of each token
        add("down_proj", L, lp.down_proj, touched * expert * wb, N * k * inter * ab, N * h * ab,
            2 * N * k * expert + 2 * N * k * h)
    else:
        linear("gate_proj", lp.gate_proj, h, inter)
        linear("up_proj", lp.up_proj, h, inter)
        add("silu_mul", L, 0, 0, 2 * N * inter * ab, N * inter * ab, 5 * N * inter)
        linear("down_proj", lp.down_proj, inter, h)
    add("residual_ffn", L, 0, 0, 2 * N * h * ab, N * h * ab, N * h)
    # --- after the layers: only the last position of each sequence goes on
    add("final_norm", 1, h, h * wb, N * h * ab, N * h * ab, 4 * N * h)
    add("lm_head", 1, vocab * h, vocab * h * wb, B * h * ab, B * vocab * FP32, 2 * B * h * vocab)
    add("sampling", 1, 0, 0, B * vocab * FP32, B * TOKEN_ID, 5 * B * vocab)
    cost = PassCost(phase="prefill" if T > 1 or starts_request else "decode", batch=B,
                    num_new_tokens=T, context_len=context_len, stages=tuple(stages),
                    weight_bytes_per_param=wb)
    return _by_kernel(cost, precision, hardware) if by_kernel else cost


def _by_kernel(cost: PassCost, precision: Precision, hardware: HardwareSpec) -> PassCost:
    if not precision.formats:
        return cost
    from inferpath.explain.kernel_cost import price_stages

    return replace(cost, stages=price_stages(cost.stages, precision, hardware))
