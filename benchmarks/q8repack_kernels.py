"""Q8_0 / Q5_0 repacked by 8 rows (csrc/quant/r8_legacy.c) against the file's layout, one
matmul at a time, at the 0.5B file's shapes: ms and weight GB/s per call, A and B
alternating, medians. Rows 1 (decode) and 512 (prefill; as laid out: the wide kernel at
avx2, gemm.c's panels at avx512).
    python benchmarks/q8repack_kernels.py --isa avx512 --threads 1 --rows 1,512 --out ...json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import inferpath  # noqa: F401 (first: the thread policy)

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", default="avx512")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,512")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ["INFERPATH_ISA"] = args.isa
    import torch
    from gguf import GGMLQuantizationType as Q
    from test_quantized import random_weight

    from inferpath.kernels import build, ops
    from inferpath.kernels.repacked import kernel_type, repack

    torch.set_num_threads(args.threads)
    shapes = [("Q8_0", 151936 // 4, 896, "lm head / 4"), ("Q5_0", 4864, 896, "ffn_gate/up"),
              ("Q5_0", 896, 4864, "(a 4864-wide Q5_0)"), ("Q5_0", 896, 896, "attn_q/o")]
    fn = build.native_quant_matmul(args.isa)
    out = {"isa": args.isa, "threads": args.threads, "load_average": os.getloadavg(), "runs": []}
    for rows in (int(r) for r in args.rows.split(",")):
        for name, n, k, what in shapes:
            if rows > 1 and n > 10000:
                n = n // 64 * 8
            weight = random_weight(getattr(Q, name), n, k, seed=0)
            packed = repack(weight, drop_source=False)
            x = torch.randn(rows, k)
            times = {"laid-out": [], "repack": []}
            reps = max(1, int(2e7 // (n * k * rows) + 1))
            for _ in range(args.rounds):
                for label, w in (("laid-out", weight), ("repack", packed)):
                    ops.run_quant_matmul(fn, x, w.data, kernel_type(w), None, n)
                    start = time.perf_counter()
                    for _ in range(reps):
                        ops.run_quant_matmul(fn, x, w.data, kernel_type(w), None, n)
                    times[label].append((time.perf_counter() - start) / reps)
            med = {label: statistics.median(t) for label, t in times.items()}
            row = {"format": name, "shape": [n, k], "what": what, "rows": rows, "ms": {l: v * 1e3 for l, v in med.items()},
                   "weight_gb_s": {l: weight.data.numel() / v / 1e9 for l, v in med.items()},
                   "repack_speedup": med["laid-out"] / med["repack"]}
            out["runs"].append(row)
            print(f"{args.isa} {args.threads}t rows {rows:4} {name} {n}x{k}: laid out {row['ms']['laid-out']:.3f} ms, "
                  f"repack {row['ms']['repack']:.3f} ms ({row['repack_speedup']:.2f}x; "
                  f"{row['weight_gb_s']['repack']:.1f} GB/s)", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
