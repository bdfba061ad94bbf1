"""The native causal prefill attention against PyTorch's SDPA, one layer at a time.

A prompt of ``--tokens`` tokens at real models' head shapes (SmolLM2-135M: 9 query heads
over 3 KV heads of 64 dims; Qwen2.5-0.5B: 14 over 2 of 64; Qwen2.5-1.5B: 12 over 2 of 128; a Llama-3-8B
layer: 32 over 8 of 128), q, k and v as the views of one fused projection (as the model hands them to
``ops.run_prefill_attention``), float32 and bfloat16. The kernel and SDPA run in
alternation, ``--repeats`` times each; the figure is the median CPU time (process_time:
this machine is shared) per layer, with the multiply-adds a second it implies (the
causal half: H * n(n+1)/2 * D for q . k and as many for the weights times v) and the
ratio. Prints a table and writes benchmarks/results/prefill_attention.json with the
machine's CPU flags. No assertions.

    python benchmarks/prefill_attention.py [--threads 1] [--tokens 512] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import inferpath  # noqa: F401  (before torch: OMP_WAIT_POLICY=PASSIVE, as every entry point; threads.py)
import torch
import torch.nn.functional as F

from inferpath.explain.probe import cpu_flags, cpu_model
from inferpath.kernels import build, ops

RESULTS = Path(__file__).parent / "results"
SHAPES = {"SmolLM2-135M": (9, 3, 64), "Qwen2.5-0.5B": (14, 2, 64), "Qwen2.5-1.5B": (12, 2, 128),
          "Llama-3-8B": (32, 8, 128)}


def cpu_seconds(fn, repeats: int, other) -> tuple[float, float]:
    """Median CPU seconds of fn and of other, run alternately."""
    fn(), other()
    mine, theirs = [], []
    for _ in range(repeats):
        for run, times in ((fn, mine), (other, theirs)):
            start = time.process_time()
            run()
            times.append(time.process_time() - start)
    return statistics.median(mine), statistics.median(theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=str(RESULTS / "prefill_attention.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, rows = args.tokens, []
    for dtype in (torch.float32, torch.bfloat16):
        fn = build.native_prefill_attention(dtype)
        if fn is None:
            print(f"no native prefill attention for {dtype} here (level {build.kernel_level(dtype)})")
            continue
        for model, (heads, kv_heads, head_dim) in SHAPES.items():
            gen = torch.Generator().manual_seed(0)
            qkv = torch.randn(n, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
            q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
            q, k, v = (t.view(n, -1, head_dim) for t in (q, k, v))  # (n, heads, head_dim), strided rows
            qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # (1, heads, n, head_dim)
            scale = head_dim ** -0.5
            native, sdpa = cpu_seconds(
                lambda: ops.run_prefill_attention(fn, q, k, v, scale), args.repeats,
                lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True, scale=scale))
            macs = 2 * heads * n * (n + 1) / 2 * head_dim
            rows.append({"model": model, "dtype": str(dtype).removeprefix("torch."), "heads": heads,
                         "kv_heads": kv_heads, "head_dim": head_dim, "native_us": native * 1e6,
                         "sdpa_us": sdpa * 1e6, "native_gmac_s": macs / native / 1e9, "speedup": sdpa / native})
    print(f"{n} tokens, {args.threads} threads, CPU time per layer, {cpu_model()}")
    print(f"{'shape':>14} {'dtype':>9} {'heads':>6} {'native':>10} {'GMAC/s':>7} {'SDPA':>10} {'SDPA/native':>11}")
    for r in rows:
        print(f"{r['model']:>14} {r['dtype']:>9} {r['heads']:>2}/{r['kv_heads']}x{r['head_dim']:<3}"
              f"{r['native_us']:>8.0f} us {r['native_gmac_s']:>7.1f} {r['sdpa_us']:>7.0f} us {r['speedup']:>11.2f}")
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out)
    out.write_text(json.dumps({
        "tokens": n, "threads": args.threads, "repeats": args.repeats, "cpu": cpu_model(),
        "machine": platform.machine(), "kernel_level": build.kernel_level(torch.float32),
        "cpu_flags": sorted(cpu_flags()), "rows": rows,
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
