"""Text and JSON for a TraceResult: measured stage times beside the cost model's prediction.

Rows are the measured rows of hooks.py. A row's prediction is the sum of the cost-model
stages it covers (``hooks.PREDICTED_BY``), and its bound is the bound of the largest of
them. ``other`` (time in no hooked module: building the attention plan, Python between
modules) has no prediction.
"""

from __future__ import annotations

from inferpath.explain.cost import PassCost
from inferpath.explain.hooks import PREDICTED_BY
from inferpath.explain.report import fmt_bytes, fmt_time
from inferpath.explain.trace import StepTrace, TraceResult

ROW_ORDER = ("embedding", "rmsnorm_attn", "q_proj", "k_proj", "v_proj", "rope", "kv_write",
             "attention", "o_proj", "residual", "rmsnorm_ffn", "gate_proj", "up_proj", "silu_mul",
             "down_proj", "moe_ffn", "final_norm", "lm_head", "sampling", "other")


def predicted(row: str, p: PassCost) -> tuple[float | None, str]:
    """Predicted seconds and bound for a measured row (None for ``other``)."""
    if row == "other":
        return None, ""
    names = PREDICTED_BY.get(row, (row,))
    stages = [s for s in p.stages if s.name in names]
    if not stages:
        return None, ""
    return sum(s.time_s for s in stages), max(stages, key=lambda s: s.time_s).bound


def rows_of(step: StepTrace) -> list[dict]:
    rows = []
    for name in ROW_ORDER:
        if name not in step.measured:
            continue
        pred, bound = predicted(name, step.predicted)
        rows.append({"stage": name, "measured_s": step.measured[name], "predicted_s": pred, "bound": bound})
    return rows


def trace_text(result: TraceResult, show_steps: int = 3) -> str:
    cfg, hw, steps = result.config, result.hardware, result.steps
    lines = [
        f"{result.model}: {cfg.num_layers} layers, d {cfg.hidden_size}, {cfg.num_heads}/{cfg.num_kv_heads} "
        f"heads, vocab {cfg.vocab_size:,}; fp32 on {hw.name} ({hw.source})",
        f"loaded in {result.load_s:.1f} s",
        "",
        f"tokens: {len(result.prompt_ids)} from {result.prompt!r} (tokenize {fmt_time(result.tokenize_s)}, "
        "on the host)",
        "  " + " ".join(f"{i}:{piece!r}" for i, piece in zip(result.prompt_ids, result.prompt_pieces, strict=True)),
        "",
    ]
    prefill, decodes = steps[0], steps[1:]
    lines.append(f"{'stage':<13} {'prefill: measured':>17} {'predicted':>10} {'ratio':>6} {'bound':>7}   "
                 f"{'decode step: measured':>21} {'predicted':>10} {'ratio':>6} {'bound':>7}")
    mean_decode = _mean_rows(decodes) if decodes else {}
    for row in rows_of(prefill):
        name = row["stage"]
        text = (f"{name:<13} {fmt_time(row['measured_s']):>17} {_t(row['predicted_s']):>10} "
                f"{_ratio(row['measured_s'], row['predicted_s']):>6} {row['bound']:>7}")
        if decodes:
            m, pred, bound = mean_decode.get(name, (0.0, None, ""))
            text += f"   {fmt_time(m):>21} {_t(pred):>10} {_ratio(m, pred):>6} {bound:>7}"
        lines.append(text)
    total = (f"{'step':<13} {fmt_time(prefill.step_s):>17} {fmt_time(prefill.predicted.time_s):>10} "
             f"{_ratio(prefill.step_s, prefill.predicted.time_s):>6} {'':>7}")
    if decodes:
        mean = sum(s.step_s for s in decodes) / len(decodes)
        pred = sum(s.predicted.time_s for s in decodes) / len(decodes)
        total += f"   {fmt_time(mean):>21} {fmt_time(pred):>10} {_ratio(mean, pred):>6}"
    lines += [total,
              f"(decode: mean of {len(decodes)} steps; ratio = measured / predicted; residual = each "
              "layer's time outside its hooked stages; other = time outside every hooked module.",
              " The prediction is the roofline alone: per-operator dispatch overhead, which dominates "
              "small stages on a CPU, is not in it.)", ""]
    for step in steps[:show_steps]:
        shown = ", ".join(f"{c.text!r} {c.probability:.3f}" for c in step.candidates)
        lines.append(f"step {step.index} ({step.phase}): top {len(step.candidates)}: {shown}")
        lines.append(f"  drew {step.token_text!r} (id {step.token_id})")
    lines.append("")
    lines.append("KV cache: " + ", ".join(f"{s.context_len} tok {fmt_bytes(s.kv_bytes)}" for s in steps))
    lines.append(f"wall time: prefill {fmt_time(result.prefill_s)} ({result.prefill_share:.1%}), "
                 f"decode {fmt_time(result.decode_s)} over {len(decodes)} steps "
                 f"({1 - result.prefill_share:.1%}); finished by {result.finish_reason}")
    lines.append(f"answer: {result.output_text!r}")
    return "\n".join(lines)


def _mean_rows(steps: list[StepTrace]) -> dict[str, tuple[float, float | None, str]]:
    out = {}
    for name in ROW_ORDER:
        present = [s for s in steps if name in s.measured]
        if not present:
            continue
        preds = [predicted(name, s.predicted) for s in present]
        pred = None if preds[0][0] is None else sum(p[0] for p in preds) / len(present)
        out[name] = (sum(s.measured[name] for s in present) / len(present), pred, preds[-1][1])
    return out


def _ratio(measured: float, predicted: float | None) -> str:
    return "-" if not predicted else f"{measured / predicted:.1f}x"


def _t(seconds: float | None) -> str:
    return "-" if seconds is None else fmt_time(seconds)


def trace_json(result: TraceResult) -> dict:
    return {
        "model": result.model, "config": result.config.to_dict(),
        "hardware": {"name": result.hardware.name, "source": result.hardware.source,
                     "memory_bandwidth": result.hardware.memory_bandwidth,
                     "peak_flops": result.hardware.peak_flops},
        "prompt": result.prompt, "prompt_ids": result.prompt_ids, "prompt_pieces": result.prompt_pieces,
        "tokenize_s": result.tokenize_s, "load_s": result.load_s,
        "prefill_s": result.prefill_s, "decode_s": result.decode_s, "prefill_share": result.prefill_share,
        "output_text": result.output_text, "finish_reason": result.finish_reason,
        "steps": [{
            "index": s.index, "phase": s.phase, "num_new_tokens": s.num_new_tokens,
            "context_len": s.context_len, "step_s": s.step_s, "predicted_s": s.predicted.time_s,
            "kv_bytes": s.kv_bytes, "token_id": s.token_id, "token_text": s.token_text,
            "candidates": [{"token_id": c.token_id, "text": c.text, "probability": c.probability}
                           for c in s.candidates],
            "stages": rows_of(s),
        } for s in result.steps],
    }
