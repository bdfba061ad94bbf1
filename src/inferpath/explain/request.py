"""Totals for one request (or a batch of identical ones): the seed's Stages 4, 7 and 8.

A request of ``prompt_tokens`` whose answer is ``output_tokens`` long runs one prefill and
then one decode pass per further sampled token. With ``ends_with_stop`` (the default, as in
the seed) the model samples one more token after the answer, the stop token, which ends the
loop and is never fed back:

    sampled tokens = output_tokens + 1         forward passes = output_tokens + 1
    final KV cache = prompt_tokens + output_tokens tokens

(the seed: 184-token answer -> 185 passes, 7 + 184 = 191 cached tokens = 63 MB). Without
it (stopped by max_tokens) there are ``output_tokens`` passes and one token fewer in cache.

Invariant: every total here is a sum over the PassCosts it holds (prefill + decode steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferpath.config import ModelConfig
from inferpath.explain.cost import PassCost, Precision, pass_cost
from inferpath.explain.hardware import HardwareSpec
from inferpath.explain.params import WeightBreakdown, weight_breakdown

BATCH_SIZES = (1, 8, 32, 64, 128, 256)
WEIGHT_DTYPES = ("bf16", "int8", "int4")
DEVICE_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class RequestSpec:
    """What is asked: the model, the hardware, and the request's shape."""

    config: ModelConfig
    hardware: HardwareSpec  # one device; ``devices`` scales it
    precision: Precision = Precision("bf16")
    prompt_tokens: int = 7
    output_tokens: int = 184
    batch: int = 1
    devices: int = 1
    ends_with_stop: bool = True
    fused_attention: bool = False

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be at least 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be at least 1, got {self.output_tokens}")
        limit = self.config.max_position_embeddings
        if self.prompt_tokens + self.output_tokens > limit:
            raise ValueError(
                f"prompt_tokens + output_tokens = {self.prompt_tokens + self.output_tokens} "
                f"exceeds the model's context of {limit} tokens"
            )

    @property
    def num_decode_passes(self) -> int:
        return self.output_tokens - (0 if self.ends_with_stop else 1)

    @property
    def final_kv_tokens(self) -> int:
        return self.prompt_tokens + self.num_decode_passes

    def pass_at(self, num_new_tokens: int, context_len: int, *, hardware: HardwareSpec | None = None,
                precision: Precision | None = None, batch: int | None = None) -> PassCost:
        """One pass of this request; the keywords override the spec (for the what-if tables)."""
        return pass_cost(self.config, hardware or self.hardware.scaled(self.devices),
                         precision or self.precision, num_new_tokens, context_len,
                         batch or self.batch, self.fused_attention)


@dataclass(frozen=True)
class DecodeSummary:
    """All decode passes of the request, summed (each at its own context length)."""

    num_passes: int
    time_s: float
    weight_bytes: float
    bytes_moved: float
    flops: float
    first: PassCost | None  # the first decode step (context = prompt + 1)
    last: PassCost | None


@dataclass(frozen=True)
class RequestCost:
    spec: RequestSpec
    weights: WeightBreakdown
    prefill: PassCost
    decode: DecodeSummary
    batch_table: list[dict] = field(default_factory=list)
    dtype_table: list[dict] = field(default_factory=list)
    device_table: list[dict] = field(default_factory=list)

    # --- KV cache and activations
    @property
    def kv_bytes_per_token(self) -> int:
        return self.spec.config.kv_bytes_per_token(self.spec.precision.kv_bytes)

    @property
    def state_bytes_per_sequence(self) -> int:
        """The fixed recurrent state of a sequence (linear-attention layers); 0 for most models."""
        return self.spec.config.state_bytes_per_sequence(self.spec.precision.kv_bytes)

    @property
    def state_bytes(self) -> int:
        return self.state_bytes_per_sequence * self.spec.batch

    @property
    def prompt_kv_bytes(self) -> int:
        return self.kv_bytes_per_token * self.spec.prompt_tokens * self.spec.batch

    @property
    def final_kv_bytes(self) -> int:
        return self.kv_bytes_per_token * self.spec.final_kv_tokens * self.spec.batch

    @property
    def activation_bytes_per_token(self) -> int:
        """One residual-stream vector: hidden_size values at the activation dtype."""
        return self.spec.config.hidden_size * self.spec.precision.activation_bytes

    @property
    def prompt_activation_bytes(self) -> int:
        return self.activation_bytes_per_token * self.spec.prompt_tokens * self.spec.batch

    @property
    def peak_layer_activation_bytes(self) -> float:
        """Largest tensor one per-layer prefill stage writes (the working set's peak)."""
        return max(s.bytes_written / s.count for s in self.prefill.stages if s.count > 1)

    # --- passes and time
    @property
    def num_passes(self) -> int:
        return 1 + self.decode.num_passes

    @property
    def total_weight_traffic(self) -> float:
        return self.prefill.weight_bytes + self.decode.weight_bytes

    @property
    def ttft_s(self) -> float:
        return self.prefill.time_s

    @property
    def decode_time_per_token_s(self) -> float:
        return self.decode.time_s / self.decode.num_passes if self.decode.num_passes else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Per sequence, at most: the floor on decode time turned into a rate."""
        return 1.0 / self.decode_time_per_token_s if self.decode.num_passes else 0.0

    @property
    def total_time_s(self) -> float:
        return self.prefill.time_s + self.decode.time_s

    @property
    def prefill_share(self) -> float:
        return self.prefill.time_s / self.total_time_s

    @property
    def fits_in_memory(self) -> bool:
        hw = self.spec.hardware.scaled(self.spec.devices)
        return self.weights.total_bytes + self.final_kv_bytes + self.state_bytes <= hw.memory_bytes


def summarize_decode(spec: RequestSpec) -> DecodeSummary:
    """Sum the decode steps at contexts prompt+1 .. prompt+num_decode_passes."""
    n = spec.num_decode_passes
    time_s = weight = moved = flops = 0.0
    first = last = None
    for step in range(1, n + 1):
        p = spec.pass_at(1, spec.prompt_tokens + step)
        time_s += p.time_s
        weight += p.weight_bytes
        moved += p.bytes_moved
        flops += p.flops
        first = first or p
        last = p
    return DecodeSummary(n, time_s, weight, moved, flops, first, last)


def _mid_decode(spec: RequestSpec, **override) -> PassCost:
    return spec.pass_at(1, spec.prompt_tokens + max(1, spec.num_decode_passes // 2), **override)


def estimate_request(spec: RequestSpec, with_tables: bool = True) -> RequestCost:
    """Everything the seed computes for one request; tables vary batch, dtype, devices."""
    weights = weight_breakdown(spec.config, spec.precision.weight_bytes)
    prefill = spec.pass_at(spec.prompt_tokens, spec.prompt_tokens)
    decode = summarize_decode(spec)
    if not with_tables:
        return RequestCost(spec, weights, prefill, decode)
    kv_token = spec.config.kv_bytes_per_token(spec.precision.kv_bytes)
    state = spec.config.state_bytes_per_sequence(spec.precision.kv_bytes)  # per sequence, any length
    final_kv = (kv_token * spec.final_kv_tokens + state) * spec.batch
    one = spec.hardware
    batch_table, dtype_table, device_table = [], [], []
    for b in BATCH_SIZES:  # throughput against latency, at the middle of the decode
        p = _mid_decode(spec, batch=b)
        batch_table.append({
            "batch": b, "step_time_s": p.time_s, "tokens_per_s_per_seq": 1 / p.time_s,
            "tokens_per_s_total": b / p.time_s, "bound": p.bound, "intensity": p.intensity,
            "kv_bytes": (kv_token * spec.final_kv_tokens + state) * b,
            "fits": weights.total_bytes + (kv_token * spec.final_kv_tokens + state) * b
            <= one.memory_bytes * spec.devices,
        })
    for name in WEIGHT_DTYPES:
        precision = Precision(name)
        p = _mid_decode(spec, precision=precision)
        total = weight_breakdown(spec.config, precision.weight_bytes).total_bytes
        dtype_table.append({
            "dtype": name, "weight_bytes": total, "step_time_s": p.time_s,
            "tokens_per_s": spec.batch / p.time_s, "fits_one_device": total <= one.memory_bytes,
        })
    for n in DEVICE_COUNTS:  # sharded: aggregate bandwidth and memory
        p = _mid_decode(spec, hardware=one.scaled(n))
        device_table.append({
            "devices": n, "aggregate_bandwidth": one.memory_bandwidth * n,
            "step_time_s": p.time_s, "tokens_per_s": spec.batch / p.time_s,
            "weight_bytes_per_device": weights.total_bytes / n,
            "fits": (weights.total_bytes + final_kv) / n <= one.memory_bytes,
        })
    return RequestCost(spec, weights, prefill, decode, batch_table, dtype_table, device_table)
