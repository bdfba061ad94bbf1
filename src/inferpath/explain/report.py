"""Plain-words text for a RequestCost: the stage tables, the totals, the seed comparison.

Returns strings; the CLI prints them. Units are decimal (1 GB = 1e9 bytes) unless a line
says GiB, as in the seed.
"""

from __future__ import annotations

from inferpath.explain.cost import PassCost
from inferpath.explain.hardware import HardwareSpec
from inferpath.explain.request import RequestCost
from inferpath.explain.seed import is_seed_example, seed_figures


def fmt_bytes(n: float, digits: int = 3) -> str:
    """Decimal units; ``digits`` significant figures (trailing zeros kept above 3)."""
    spec = f"#.{digits}g" if digits > 3 else f".{digits}g"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{format(n / scale, spec).rstrip('.')} {unit}"
    return f"{n:.0f} B"


def fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.3g} us"
    return f"{s * 1e9:.3g} ns" if s else "0"


def fmt_flops(n: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


def fmt_params(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,.0f}"


def stage_table(p: PassCost) -> str:
    """One row per stage: what it reads, writes and computes, and which bound holds."""
    head = (f"{'stage':<18} {'x':>3} {'params':>8} {'read':>9} {'written':>9} {'FLOPs':>8} "
            f"{'FLOP/B':>7} {'t compute':>10} {'t memory':>10} {'bound':>7}")
    rows = [head, "-" * len(head)]
    for s in p.stages:
        rows.append(
            f"{s.name:<18} {s.count:>3} {fmt_params(s.params):>8} {fmt_bytes(s.bytes_read):>9} "
            f"{fmt_bytes(s.bytes_written):>9} {fmt_flops(s.flops):>8} {s.intensity:>7.3g} "
            f"{fmt_time(s.compute_time_s):>10} {fmt_time(s.memory_time_s):>10} {s.bound:>7}"
        )
    rows.append("-" * len(head))
    rows.append(f"{'total':<18} {'':>3} {'':>8} {fmt_bytes(p.bytes_read):>9} "
                f"{fmt_bytes(p.bytes_written):>9} {fmt_flops(p.flops):>8} {p.intensity:>7.3g} "
                f"{fmt_time(p.compute_time_s):>10} {fmt_time(p.memory_time_s):>10} {p.bound:>7}")
    rows.append(f"pass time (each stage at its own bound, summed): {fmt_time(p.time_s)}")
    return "\n".join(rows)


def summary_lines(cost: RequestCost) -> list[str]:
    spec, w = cost.spec, cost.weights
    cfg, hw = spec.config, spec.hardware.scaled(spec.devices)
    dtype = spec.precision.compute_dtype
    stop = " + a stop token" if spec.ends_with_stop else ""
    lines = [
        f"{cfg.name or cfg.architecture} on {hw.name}: {fmt_bytes(hw.memory_bandwidth)}/s, "
        f"{fmt_flops(hw.flops_for(dtype))}FLOP/s {dtype}, ridge {hw.ridge_point(dtype):.3g} FLOP/byte; "
        f"{spec.precision.description} weights",
        f"request: {spec.prompt_tokens} prompt tokens, an answer of {spec.output_tokens} tokens{stop}, "
        f"batch {spec.batch}",
        "",
        f"weights: {fmt_bytes(w.total_bytes, 4)} ({fmt_params(w.total_params)} parameters): embedding "
        f"{fmt_bytes(w.embedding_bytes, 4)}, {cfg.num_layers} layers x {fmt_bytes(w.per_layer_bytes, 4)} = "
        f"{fmt_bytes(w.layers_bytes, 4)}, LM head "
        + (f"{fmt_bytes(w.head_bytes, 4)}" if w.head_params else "tied to the embedding"),
        f"  in a layer the FFN holds {w.ffn_share:.1%} of the parameters, attention {w.attention_share:.1%}",
    ]
    if w.layer_groups:  # layers of several kinds: the mean above, each kind here
        lines[-2] = lines[-2].replace(f"{cfg.num_layers} layers x {fmt_bytes(w.per_layer_bytes, 4)} =",
                                      f"{cfg.num_layers} layers (below) =")
        lines[-1] = lines[-1].replace("in a layer", "over the layers")
        lines.append("  layers: " + ", ".join(f"{n} x {kind} ({fmt_bytes(p * w.weight_bytes_per_param, 4)} each)"
                                           for kind, n, p in w.layer_groups))
    if cfg.is_moe:
        lines.append(f"  mixture of experts: {fmt_params(w.total_params)} total, "
                     f"{fmt_params(w.active_params)} active per token "
                     f"({cfg.num_experts_per_tok} of {cfg.num_experts} experts)")
        if cost.decode.first is not None:
            lines.append("  " + experts_read_sentence(cost.decode.first, cfg, spec.batch))
    lines += [
        f"KV cache: {cost.kv_bytes_per_token:,} B per token; {fmt_bytes(cost.prompt_kv_bytes)} for the "
        f"prompt, {fmt_bytes(cost.final_kv_bytes)} at the end ({spec.final_kv_tokens} tokens"
        + (f" x {spec.batch} sequences)" if spec.batch > 1 else ")"),
    ]
    if cfg.is_mla:
        qk_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        plain = cfg.num_layers * cfg.num_heads * (qk_dim + cfg.v_head_dim) * spec.precision.kv_bytes
        lines.append(f"  latent attention: {cfg.num_layers} layers x ({cfg.kv_lora_rank} latent + "
                     f"{cfg.qk_rope_head_dim} RoPE values) x {spec.precision.kv_bytes} B; as plain attention "
                     f"({cfg.num_heads} K and V heads of {qk_dim} / {cfg.v_head_dim}) it would be {plain:,} B")
    if cost.state_bytes_per_sequence:
        lines.append(f"  linear attention: {cfg.num_attention_layers} of {cfg.num_layers} layers cache K and V; the "
                     f"other {cfg.num_linear_layers} keep a fixed state of {fmt_bytes(cost.state_bytes_per_sequence)} "
                     f"per sequence whatever its length (convolution inputs + delta-rule matrices)")
    lines += [
        f"activations: {fmt_bytes(cost.activation_bytes_per_token)} per token (one hidden vector), "
        f"{fmt_bytes(cost.prompt_activation_bytes)} for the prompt; the largest per-layer tensor in "
        f"prefill is {fmt_bytes(cost.peak_layer_activation_bytes)}",
        "",
        phase_sentence(cost.prefill, hw, dtype, "prefill") + "; that is the time to first token",
    ]
    if cost.decode.first is not None:
        d = cost.decode.first
        lines.append(phase_sentence(d, hw, dtype, "decode")
                     + f"; at most {cost.tokens_per_s:.1f} tokens/s per sequence")
    lines += [
        f"{cost.num_passes} forward passes (1 prefill + {cost.decode.num_passes} decode), "
        f"{fmt_bytes(cost.total_weight_traffic, 4)} of weight traffic, {fmt_time(cost.total_time_s)} in all "
        f"(decode {fmt_time(cost.decode.time_s)}); prefill is {cost.prefill_share:.2%} of the wall time",
    ]
    if not cost.fits_in_memory:
        lines.append(f"NOTE: {fmt_bytes(w.total_bytes + cost.final_kv_bytes)} of weights and KV do not fit in "
                     f"{fmt_bytes(hw.memory_bytes)}; shard over more devices (--devices) or quantize (--dtype)")
    return lines


def experts_read_sentence(p: PassCost, cfg, batch: int) -> str:
    """What one decode step reads of the experts: the routed ones its tokens touch (top-k of
    n a token, in each MoE layer) and the shared ones, which every token runs."""
    routed = sum(p.stage(n).weight_bytes for n in ("gate_proj", "up_proj", "down_proj"))
    every = sum(p.stage(n).count for n in ("gate_proj",))
    names = {s.name for s in p.stages}
    shared = sum(p.stage(n).weight_bytes for n in ("shared_gate_proj", "shared_up_proj", "shared_down_proj")
                 if n in names)
    tokens = "a token" if batch == 1 else f"a token, {batch} sequences (experts touched, expected under uniform routing)"
    text = (f"a decode step reads the routed experts: top-{cfg.num_experts_per_tok} of {cfg.num_experts} {tokens} "
            f"in each of {every} MoE layers, {fmt_bytes(routed, 4)} of expert weights")
    if shared:
        text += f", plus {fmt_bytes(shared, 4)} of shared experts (every token)"
    return text


def phase_sentence(p: PassCost, hw: HardwareSpec, dtype: str, phase: str) -> str:
    what = "per token" if p.num_new_tokens == 1 else f"for {p.num_new_tokens} tokens"
    return (f"{phase} is {p.bound}-bound: {fmt_bytes(p.weight_bytes, 4)} of weights read {what}, "
            f"{p.layer_matmul_intensity:.3g} FLOP/byte in the layers' matrices against a ridge of "
            f"{hw.ridge_point(dtype):.3g}, {fmt_time(p.time_s)} at {fmt_bytes(hw.memory_bandwidth)}/s")


def tables_text(cost: RequestCost) -> list[str]:
    lines = ["", "batch size (decode step at mid-answer): throughput against latency"]
    for r in cost.batch_table:
        lines.append(f"  batch {r['batch']:>4}: step {fmt_time(r['step_time_s']):>8}, "
                     f"{r['tokens_per_s_per_seq']:7.1f} tok/s each, {r['tokens_per_s_total']:9.1f} tok/s "
                     f"in all, {r['bound']}-bound, KV {fmt_bytes(r['kv_bytes'])}"
                     + ("" if r["fits"] else " (does not fit)"))
    lines.append("weight dtype: fewer bytes, faster decode")
    for r in cost.dtype_table:
        lines.append(f"  {r['dtype']:>5}: weights {fmt_bytes(r['weight_bytes']):>8}, step "
                     f"{fmt_time(r['step_time_s']):>8}, {r['tokens_per_s']:7.1f} tok/s"
                     + ("" if r["fits_one_device"] else " (more than one device's memory)"))
    lines.append("sharded over N devices: aggregate bandwidth (communication not counted)")
    for r in cost.device_table:
        lines.append(f"  {r['devices']} x: {fmt_bytes(r['aggregate_bandwidth'])}/s, step "
                     f"{fmt_time(r['step_time_s']):>8}, {r['tokens_per_s']:7.1f} tok/s, "
                     f"{fmt_bytes(r['weight_bytes_per_device'])} of weights each"
                     + ("" if r["fits"] else " (does not fit)"))
    return lines


def seed_text(cost: RequestCost) -> list[str]:
    """The seed's figures beside ours; for the loose ones, what the seed's figure counts."""
    if not is_seed_example(cost.spec):
        return []
    lines = ["", "the seed's figures (Llama-3-70B, H100 SXM, 7 prompt tokens, 184-token answer):"]
    for f in seed_figures(cost):
        mark = "=" if f.matches else "~"
        lines.append(f"  {f.name:<38} seed {f.seed_text:<20} {mark} {f.exact_text}")
        if f.counts and not f.matches:
            lines.append(f"  {'':<38}   {f.counts}")
    return lines


def explain_text(cost: RequestCost, decode_step: PassCost | None = None) -> str:
    """The whole plain-words report: totals, both stage tables, the variations, the seed.

    ``decode_step`` is the decode pass to tabulate (default: the first, at prompt + 1).
    """
    decode_step = decode_step or cost.decode.first
    parts = summary_lines(cost)
    parts += ["", f"prefill, {cost.spec.prompt_tokens} tokens:", stage_table(cost.prefill)]
    if decode_step is not None:
        parts += ["", f"one decode step at context {decode_step.context_len} "
                      f"(batch {decode_step.batch}):", stage_table(decode_step)]
    parts += tables_text(cost) + seed_text(cost)
    return "\n".join(parts)


def explain_json(cost: RequestCost, decode_step: PassCost | None = None) -> dict:
    """The same content for programs: bytes, seconds, FLOPs, unrounded."""
    spec = cost.spec
    decode_step = decode_step or cost.decode.first
    return {
        "model": spec.config.to_dict(),
        "hardware": {"name": spec.hardware.name, "memory_bandwidth": spec.hardware.memory_bandwidth,
                     "peak_flops": spec.hardware.peak_flops, "memory_bytes": spec.hardware.memory_bytes,
                     "source": spec.hardware.source, "devices": spec.devices},
        "request": {"prompt_tokens": spec.prompt_tokens, "output_tokens": spec.output_tokens,
                    "batch": spec.batch, "dtype": spec.precision.weights,
                    "weight_format": spec.precision.description,
                    "bytes_per_weight": spec.precision.weight_bytes,
                    "ends_with_stop": spec.ends_with_stop, "fused_attention": spec.fused_attention},
        "weights": cost.weights.to_dict(),
        "kv_cache": {"bytes_per_token": cost.kv_bytes_per_token, "prompt_bytes": cost.prompt_kv_bytes,
                     "final_bytes": cost.final_kv_bytes, "final_tokens": spec.final_kv_tokens,
                     "state_bytes_per_sequence": cost.state_bytes_per_sequence},
        "activations": {"bytes_per_token": cost.activation_bytes_per_token,
                        "prompt_bytes": cost.prompt_activation_bytes,
                        "peak_layer_bytes": cost.peak_layer_activation_bytes},
        "totals": {"num_passes": cost.num_passes, "num_decode_passes": cost.decode.num_passes,
                   "total_weight_traffic": cost.total_weight_traffic, "ttft_s": cost.ttft_s,
                   "decode_time_s": cost.decode.time_s,
                   "decode_time_per_token_s": cost.decode_time_per_token_s,
                   "tokens_per_s": cost.tokens_per_s, "total_time_s": cost.total_time_s,
                   "prefill_share": cost.prefill_share, "fits_in_memory": cost.fits_in_memory},
        "prefill": cost.prefill.to_dict(),
        "decode_step": decode_step.to_dict() if decode_step else None,
        "batch_table": cost.batch_table, "dtype_table": cost.dtype_table,
        "device_table": cost.device_table,
        "seed": [f.to_dict() for f in seed_figures(cost)] if is_seed_example(spec) else None,
    }
