"""Text for a request trace (explain/trace.py ``request_trace``): measured beside predicted.

One table, rows in the seed's stage order (engine/trace_stages.py), with the request's
prefill steps and its decode steps summed; then the fused rows named, the tokens with
their top candidates, the KV cache and the batch each step shared.
"""

from __future__ import annotations

from inferpath.explain.report import fmt_bytes, fmt_time


def trace_text(trace: dict, prompt_pieces: list[str] | None = None, show_steps: int = 3) -> str:
    cfg, hw, steps = trace["config"], trace["hardware"], trace["steps"]
    lines = [
        f"{trace['model']}: {cfg['num_layers']} layers, d {cfg['hidden_size']}, {cfg['num_heads']}/"
        f"{cfg['num_kv_heads']} heads, vocab {cfg['vocab_size']:,}; {trace['dtype']} on {hw['name']} "
        f"({hw['source']}); ridge {hw['ridge']:.3g} FLOP/byte",
        f"prompt: {trace['num_prompt_tokens']} tokens",
    ]
    if prompt_pieces:
        lines.append("  " + " ".join(repr(p) for p in prompt_pieces))
    lines += ["", f"{'stage':<13} {'prefill: measured':>17} {'predicted':>10} {'ratio':>6} {'bound':>7}   "
                  f"{'decode: measured':>16} {'predicted':>10} {'ratio':>6} {'FLOP/B':>7} {'bound':>7}"]
    for row in trace["summary"]:
        lines.append(
            f"{row['stage']:<13} {fmt_time(row['prefill_measured_s']):>17} {_t(row['prefill_predicted_s']):>10} "
            f"{_ratio(row['prefill_measured_s'], row['prefill_predicted_s']):>6} {row['prefill_bound']:>7}   "
            f"{fmt_time(row['decode_measured_s']):>16} {_t(row['decode_predicted_s']):>10} "
            f"{_ratio(row['decode_measured_s'], row['decode_predicted_s']):>6} "
            f"{_f(row['decode_intensity']):>7} {row['decode_bound']:>7}")
    prefill = [s for s in steps if s["phase"] == "prefill"]
    decode = [s for s in steps if s["phase"] == "decode"]
    lines.append(
        f"{'step total':<13} {fmt_time(trace['prefill_s']):>17} {fmt_time(sum(s['predicted_s'] for s in prefill)):>10}"
        f" {'':>6} {'':>7}   {fmt_time(trace['decode_s']):>16} {fmt_time(sum(s['predicted_s'] for s in decode)):>10}")
    call = hw.get("module_call_s", 0.0)
    lines.append(f"(prefill: {len(prefill)} step(s); decode: {len(decode)} steps, summed; measured on the "
                 f"{trace.get('decode_path') or '-'} path. ratio = measured / predicted; the prediction prices each "
                 "matmul at its format's probed kernel rate,")
    lines.append(f" every other stage at the roofline, plus {call * 1e6:.1f} us per module call on the module path "
                 "(none on the native path).")
    lines.append(" other = the step outside every timed module: laying out the batch, the attention plan.)")
    for row, note in trace["fusions"].items():
        lines.append(f"  {row}: {note}")
    lines.append("")
    for step in steps[:show_steps]:
        token = step["token"]
        if token is None:
            continue
        shown = ", ".join(f"{c['text']!r} {c['probability']:.3f}" for c in token["top"])
        lines.append(f"step {step['index']} ({step['phase']}, {step['num_seqs']} seq, "
                     f"{step['num_prefill_tokens']}+{step['num_decode_tokens']} tokens): top 5: {shown}")
        lines.append(f"  drew {token['text']!r} (id {token['id']})")
        lines += _experts_lines(step)
    lines.append("")
    lines.append("KV cache: " + ", ".join(f"{s['context_len']} tok {fmt_bytes(s['kv_bytes'])}" for s in steps[:6])
                 + (" ..." if len(steps) > 6 else ""))
    lines.append(f"batch per step (sequences): {[s['num_seqs'] for s in steps]}")
    lines.append(f"wall time: prefill {fmt_time(trace['prefill_s'])} ({trace['prefill_share']:.1%}), "
                 f"decode {fmt_time(trace['decode_s'])} over {len(decode)} steps ({1 - trace['prefill_share']:.1%})")
    return "\n".join(lines)


def _experts_lines(step: dict) -> list[str]:
    """An MoE step: the experts each layer's router chose, and their bytes beside the nominal."""
    experts = step.get("experts")
    if not experts:
        return []
    chosen = "; ".join(f"L{layer['layer']}: {layer['experts']}" for layer in experts["layers"][:4])
    more = " ..." if len(experts["layers"]) > 4 else ""
    return [f"  experts touched (of {experts['num_experts']}, top-{experts['top_k']} a token): {chosen}{more}",
            f"  {experts['distinct']} distinct over {len(experts['layers'])} MoE layers "
            f"(uniform routing expects {experts['expected_per_layer']:.1f} a layer): expert weights read "
            f"{fmt_bytes(experts['weight_bytes_read'])}, nominal {fmt_bytes(experts['weight_bytes_nominal'])}"]


def _ratio(measured: float, predicted: float | None) -> str:
    return "-" if not predicted or not measured else f"{measured / predicted:.1f}x"


def _t(seconds: float | None) -> str:
    return "-" if seconds is None else fmt_time(seconds)


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
