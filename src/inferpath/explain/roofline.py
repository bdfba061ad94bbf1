"""The roofline chart: each stage at its arithmetic intensity, under the hardware's roof.

Attainable FLOP/s at intensity I is ``min(peak, bandwidth * I)``: a sloped memory roof
meeting a flat compute roof at the ridge point. Because the cost model times each stage
as ``max(FLOPs / peak, bytes / bandwidth)``, every stage sits on the roof; where on it
(left of the ridge: memory-bound) is the point. Prefill is placed at several prompt
lengths (intensity grows with tokens) and decode at several batch sizes (intensity grows
with sequences sharing one read of the weights). Stages with no FLOPs (tokenize,
embedding lookup, KV write) have no place on a log-log chart and are left out.
"""

from __future__ import annotations

from pathlib import Path

from inferpath.config import ModelConfig
from inferpath.explain.cost import Precision, pass_cost
from inferpath.explain.hardware import HardwareSpec

PROMPT_LENGTHS = (7, 128, 2000, 8000)
BATCH_SIZES = (1, 8, 64, 256)
_GROUPS = {  # stage -> marker group
    **dict.fromkeys(("q_proj", "k_proj", "v_proj", "o_proj", "router", "gate_proj", "up_proj",
                     "down_proj"), "layer matmuls"),
    **dict.fromkeys(("q_a_proj", "q_b_proj", "kv_a_proj", "q_absorb", "kv_b_proj", "v_up", "gdn_in_proj",
                     "gdn_out_proj", "dense_gate_proj", "dense_up_proj", "dense_down_proj",
                     "shared_gate_proj", "shared_up_proj", "shared_down_proj"), "layer matmuls"),
    **dict.fromkeys(("attn_scores", "softmax", "attn_weighted_sum", "gdn_recurrence"), "attention"),
    "lm_head": "LM head",
}
_MARKERS = {"layer matmuls": "o", "attention": "^", "elementwise": "s", "LM head": "D"}


def roofline_points(config: ModelConfig, hardware: HardwareSpec, precision: Precision,
                    prompt_lengths=PROMPT_LENGTHS, batch_sizes=BATCH_SIZES,
                    decode_context: int = 1024) -> list[dict]:
    """One point per (pass, stage with FLOPs), plus one per whole pass (stage "pass")."""
    points = []
    limit = config.max_position_embeddings
    passes = [(f"prefill {n} tokens", pass_cost(config, hardware, precision, n, n))
              for n in prompt_lengths if n <= limit]
    context = min(decode_context, limit)
    passes += [(f"decode batch {b}", pass_cost(config, hardware, precision, 1, context, b))
               for b in batch_sizes]
    for label, p in passes:
        for s in [*p.stages, None]:
            flops, moved, time_s = (s.flops, s.bytes_moved, s.time_s) if s else (p.flops, p.bytes_moved, p.time_s)
            if flops <= 0 or time_s <= 0:
                continue
            points.append({
                "pass": label, "phase": p.phase, "stage": s.name if s else "pass",
                "group": _GROUPS.get(s.name, "elementwise") if s else "pass",
                "intensity": flops / moved, "flops_per_s": flops / time_s, "time_s": time_s,
                "bound": s.bound if s else p.bound,
            })
    return points


def plot_roofline(points: list[dict], hardware: HardwareSpec, compute_dtype: str,
                  out: Path, title: str) -> Path:
    """Draw the roofline with ``points`` on it and save a PNG to ``out``."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt
    import numpy as np

    peak, bw = hardware.flops_for(compute_dtype), hardware.memory_bandwidth
    ridge = peak / bw
    lo = min([p["intensity"] for p in points] + [ridge]) / 3
    hi = max([p["intensity"] for p in points] + [ridge]) * 3
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    fig, ax = plt.subplots(figsize=(10, 6.5), dpi=110)
    ax.plot(xs, np.minimum(peak, bw * xs), color="black", lw=2, label="roof: min(peak, bandwidth x I)")
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.3g} FLOP/B", (ridge, peak), xytext=(-8, 8), ha="right",
                textcoords="offset points", color="grey")
    labels = list(dict.fromkeys(p["pass"] for p in points))
    prefill = [lab for lab in labels if lab.startswith("prefill")]
    decode = [lab for lab in labels if lab.startswith("decode")]
    colors = {lab: plt.cm.Blues(0.45 + 0.5 * i / max(1, len(prefill) - 1)) for i, lab in enumerate(prefill)}
    colors |= {lab: plt.cm.Oranges(0.45 + 0.5 * i / max(1, len(decode) - 1)) for i, lab in enumerate(decode)}
    for p in points:
        stars = p["group"] == "pass"
        ax.scatter(p["intensity"], p["flops_per_s"], color=colors[p["pass"]],
                   marker="*" if stars else _MARKERS[p["group"]], s=220 if stars else 36,
                   edgecolor="black" if stars else "none", zorder=3 if stars else 2, alpha=0.9)
        if stars:  # name the whole pass beside its star
            short = p["pass"].replace(" tokens", "").replace("batch ", "b")
            below = p["phase"] == "prefill"  # prefill labels below right, decode above left
            ax.annotate(short, (p["intensity"], p["flops_per_s"]), xytext=(8, -12) if below else (-8, 8),
                        ha="left" if below else "right", textcoords="offset points", fontsize=8)
    for lab in labels:  # legend: one entry per pass (colour) and per stage group (marker)
        ax.scatter([], [], color=colors[lab], marker="s", label=lab)
    for group, marker in [*_MARKERS.items(), ("whole pass", "*")]:
        ax.scatter([], [], color="white", edgecolor="black", marker=marker, label=group)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel(f"attained {compute_dtype} FLOP/s")
    ax.set_title(f"{title}\neach small marker is one stage's kernel; a star is the whole pass", fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8, ncol=2)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
