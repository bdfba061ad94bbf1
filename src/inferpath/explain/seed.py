"""The seed article's Llama-3-70B figures beside the cost model's exact values.

The seed traces "What is a quadratic equation?" (7 tokens) through Llama-3-70B on an
H100 SXM to a 184-token answer. Most of its figures are the exact value rounded; a few
count something slightly different from what their sentence says. For those, ``reading``
is the seed's own arithmetic recomputed, and ``counts`` says in words what it counts, so
the output can show both.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferpath.explain.cost import Precision, pass_cost
from inferpath.explain.hardware import get_hardware
from inferpath.explain.presets import MODEL_PRESETS
from inferpath.explain.request import RequestCost, RequestSpec, estimate_request

SEED_MODEL, SEED_HARDWARE, SEED_PROMPT, SEED_OUTPUT = "llama-3-70b", "h100-sxm", 7, 184
GiB = 2**30
MiB = 2**20


@dataclass(frozen=True)
class SeedFigure:
    """One figure of the seed: its text, its value, ours, and how far rounding reaches."""

    name: str
    seed_text: str
    seed_value: float
    exact: float
    exact_text: str
    tolerance: float  # absolute: how far the seed's rounding reaches
    reading: float | None = None  # the seed's own arithmetic, where it differs from exact
    counts: str = ""  # what the seed's figure counts, where that differs

    @property
    def matches(self) -> bool:
        """The exact value rounds to the seed's figure."""
        return abs(self.exact - self.seed_value) <= self.tolerance

    @property
    def reading_matches(self) -> bool:
        value = self.exact if self.reading is None else self.reading
        return abs(value - self.seed_value) <= self.tolerance

    def to_dict(self) -> dict:
        return {"name": self.name, "seed": self.seed_text, "seed_value": self.seed_value,
                "exact": self.exact, "exact_text": self.exact_text, "matches": self.matches,
                "reading": self.reading, "counts": self.counts}


def seed_spec(**changes) -> RequestSpec:
    base = dict(config=MODEL_PRESETS[SEED_MODEL], hardware=get_hardware(SEED_HARDWARE),
                precision=Precision("bf16"), prompt_tokens=SEED_PROMPT, output_tokens=SEED_OUTPUT)
    base.update(changes)
    return RequestSpec(**base)


def is_seed_example(spec: RequestSpec) -> bool:
    return spec == seed_spec(fused_attention=spec.fused_attention)


def seed_figures(cost: RequestCost | None = None) -> list[SeedFigure]:
    """Every figure of the seed's example, computed from the cost model."""
    cost = cost or estimate_request(seed_spec(), with_tables=False)
    return _weight_figures(cost) + _kv_figures(cost) + _time_figures(cost) + _intensity_figures(cost)


def _layers_gb(cost: RequestCost) -> float:
    """The seed's "137 GB": the layers' weights, rounded to whole GB."""
    return round(cost.weights.layers_bytes / 1e9) * 1e9


def _weight_figures(cost: RequestCost) -> list[SeedFigure]:
    w, num_layers = cost.weights, cost.spec.config.num_layers
    seed_layer = _layers_gb(cost) / num_layers
    return [
        SeedFigure("embedding table", "2.1 GB", 2.1e9, w.embedding_bytes,
                   f"{w.embedding_bytes / 1e9:.3f} GB", 0.05e9),
        SeedFigure("LM head", "2.1 GB", 2.1e9, w.head_bytes, f"{w.head_bytes / 1e9:.3f} GB", 0.05e9),
        SeedFigure("one layer", "1.712 GB", 1.712e9, w.per_layer_bytes, f"{w.per_layer_bytes / 1e9:.4f} GB",
                   0.0005e9, reading=seed_layer,
                   counts=f"{w.per_layer_params:,} parameters are {w.per_layer_bytes / 1e9:.4f} GB; 1.712 is "
                          f"the seed's 137 GB / {num_layers} layers = {seed_layer / 1e9:.4f} GB"),
        SeedFigure("all weights", "about 140 GB", 140e9, w.total_bytes, f"{w.total_bytes / 1e9:.1f} GB", 5e9),
        SeedFigure("FFN share of a layer", "82%", 0.82, w.ffn_share, f"{w.ffn_share:.2%}", 0.005),
        SeedFigure("attention share of a layer", "18%", 0.18, w.attention_share,
                   f"{w.attention_share:.2%}", 0.005),
    ]


def _kv_figures(cost: RequestCost) -> list[SeedFigure]:
    cfg, kv_token = cost.spec.config, cost.kv_bytes_per_token
    kv64 = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * cost.spec.precision.kv_bytes
    return [
        SeedFigure("KV bytes per token", "327,680 B", 327_680, kv_token, f"{kv_token:,} B", 0),
        SeedFigure("KV per token, in MB", "0.33 MB", 0.33e6, kv_token, f"{kv_token / 1e6:.3f} MB", 0.005e6),
        SeedFigure("KV of the 7-token prompt", "2.3 MB", 2.3e6, cost.prompt_kv_bytes,
                   f"{cost.prompt_kv_bytes / 1e6:.2f} MB", 0.05e6),
        SeedFigure("KV of 8,000 tokens", "2.6 GB", 2.6e9, kv_token * 8000,
                   f"{kv_token * 8000 / 1e9:.2f} GB", 0.05e9),
        SeedFigure("KV per token with 64 KV heads", "2.5 MB", 2.5e6, kv64, f"{kv64 / 1e6:.2f} MB", 0.05e6,
                   reading=kv64 / MiB * 1e6,
                   counts=f"{kv64:,} B is 2.5 MiB (binary), {kv64 / 1e6:.2f} MB decimal"),
        SeedFigure("KV of 8,000 tokens with 64 KV heads", "20 GB", 20e9, kv64 * 8000,
                   f"{kv64 * 8000 / 1e9:.2f} GB", 0.5e9, reading=kv64 * 8000 / GiB * 1e9,
                   counts=f"{kv64 * 8000 / 1e9:.2f} GB is {kv64 * 8000 / GiB:.1f} GiB: the seed's 20 GB is binary"),
        SeedFigure("final KV cache", "63 MB", 63e6, cost.final_kv_bytes, f"{cost.final_kv_bytes / 1e6:.1f} MB",
                   0.5e6, counts=f"{cost.spec.final_kv_tokens} tokens (7 prompt + 184 answer; the stop token "
                                 f"is never cached) x {kv_token:,} B"),
    ]


def _time_figures(cost: RequestCost) -> list[SeedFigure]:
    w, hw, decode = cost.weights, cost.spec.hardware, cost.decode
    step_s = cost.decode_time_per_token_s
    seed_step_s = _layers_gb(cost) / hw.memory_bandwidth  # 137 GB / 3.35 TB/s
    h200 = estimate_request(seed_spec(hardware=get_hardware("h200")), with_tables=False)
    int8 = estimate_request(seed_spec(precision=Precision("int8")), with_tables=False)
    kv_read = cost.kv_bytes_per_token * decode.first.context_len  # the whole cache, once per step
    model_share = decode.first.weight_bytes / (decode.first.weight_bytes + kv_read)
    per_pass = cost.total_weight_traffic / cost.num_passes
    return [
        SeedFigure("ridge point (H100 SXM, bf16)", "about 295 FLOP/byte", 295, hw.ridge_point("bf16"),
                   f"{hw.ridge_point('bf16'):.1f} FLOP/byte", 0.5),
        SeedFigure("weights read per decode step", "137 GB", 137e9, decode.first.weight_bytes,
                   f"{decode.first.weight_bytes / 1e9:.1f} GB", 0.5e9, reading=w.layers_bytes,
                   counts=f"137 GB is the {w.num_layers} layers ({w.layers_bytes / 1e9:.1f} GB); a step also "
                          f"reads the LM head ({w.head_bytes / 1e9:.1f} GB) and one embedding row"),
        SeedFigure("decode time per token", "about 41 ms", 0.041, step_s, f"{step_s * 1e3:.1f} ms", 0.0005,
                   reading=seed_step_s,
                   counts=f"41 ms is 137 GB / 3.35 TB/s = {seed_step_s * 1e3:.1f} ms, the layers alone; with "
                          f"the LM head and the KV cache a step takes {step_s * 1e3:.1f} ms"),
        SeedFigure("decode tokens/s at batch 1", "about 24", 24, cost.tokens_per_s, f"{cost.tokens_per_s:.1f}", 0.5),
        SeedFigure("decode time per token on H200", "about 29 ms", 0.029, h200.decode_time_per_token_s,
                   f"{h200.decode_time_per_token_s * 1e3:.1f} ms", 0.0005),
        SeedFigure("decode tokens/s on H200", "near 35", 35, h200.tokens_per_s, f"{h200.tokens_per_s:.1f}", 0.5),
        SeedFigure("int8 decode time / bf16", "roughly half", 0.5, int8.decode_time_per_token_s / step_s,
                   f"{int8.decode_time_per_token_s / step_s:.3f}", 0.01),
        SeedFigure("model share of decode bytes", "over 99.99%", 0.9999, model_share, f"{model_share:.5%}", 0.0001),
        SeedFigure("forward passes", "185", 185, cost.num_passes, f"{cost.num_passes}", 0,
                   counts=f"1 prefill + {decode.num_passes} decode passes; the last samples the stop token"),
        SeedFigure("total weight traffic", "about 25.2 TB", 25.2e12, cost.total_weight_traffic,
                   f"{cost.total_weight_traffic / 1e12:.2f} TB", 0.05e12,
                   reading=decode.num_passes * _layers_gb(cost),
                   counts=f"25.2 TB is {decode.num_passes} decode passes x 137 GB (layers only); all "
                          f"{cost.num_passes} passes read {per_pass / 1e9:.1f} GB each"),
        # "roughly": one significant figure
        SeedFigure("prefill time (TTFT)", "roughly 40 ms", 0.040, cost.ttft_s, f"{cost.ttft_s * 1e3:.1f} ms", 0.005,
                   counts="a 7-token prefill is memory-bound too: it reads every weight once, as a decode "
                          "step does"),
        SeedFigure("decode time, whole answer", "7.7 s", 7.7, decode.time_s, f"{decode.time_s:.2f} s", 0.05,
                   reading=cost.total_time_s,
                   counts=f"{decode.num_passes} decode passes take {decode.time_s:.2f} s; 7.7 s is all "
                          f"{cost.num_passes} passes, prefill included ({cost.total_time_s:.2f} s)"),
        SeedFigure("prefill share of wall time", "half a percent", 0.005, cost.prefill_share,
                   f"{cost.prefill_share:.2%}", 0.0005),
    ]


def _intensity_figures(cost: RequestCost) -> list[SeedFigure]:
    spec, prefill, step = cost.spec, cost.prefill, cost.decode.first
    long_prefill = pass_cost(spec.config, spec.hardware, spec.precision, 2000, 2000)
    long_intensity = long_prefill.layer_matmul_intensity
    return [
        SeedFigure("prefill intensity, 7 tokens", "about 14 FLOP/byte", 14, prefill.layer_matmul_intensity,
                   f"{prefill.layer_matmul_intensity:.1f} FLOP/byte", 0.5,
                   reading=prefill.layer_matmul_flops_per_param,
                   counts="14 is FLOPs per weight *parameter* (2 x 7 tokens); a bf16 parameter is 2 bytes, "
                          "so per byte it is 7"),
        SeedFigure("prefill intensity, 2,000 tokens", "roughly 4,000", 4000, long_intensity,
                   f"{long_intensity:,.0f} FLOP/byte", 50, reading=long_prefill.layer_matmul_flops_per_param,
                   counts=f"4,000 is FLOPs per parameter (2 x 2,000); per byte moved (bf16 weights plus the "
                          f"activations) it is {long_intensity:,.0f}, still far above the ridge of 295"),
        SeedFigure("decode intensity", "about 2 FLOP/byte", 2, step.layer_matmul_intensity,
                   f"{step.layer_matmul_intensity:.2f} FLOP/byte", 0.5, reading=step.layer_matmul_flops_per_param,
                   counts="2 is FLOPs per parameter; per bf16 byte a decode step does 1 FLOP"),
        SeedFigure("prompt activations", "about 229 KB", 229e3, cost.prompt_activation_bytes,
                   f"{cost.prompt_activation_bytes / 1e3:.1f} KB", 1e3,
                   reading=spec.prompt_tokens * spec.config.hidden_size * 4,
                   counts="229 KB is 7 x 8,192 values at 4 bytes (fp32); in bf16 they are half that"),
    ]
