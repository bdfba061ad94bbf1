"""The quantized GEMM alone at prefill shapes: 512 rows of x against a 1.5B model's weights.

Per format and (out, in) shape of Qwen2.5-1.5B's projections (the fused Q/K/V 2048 x 1536,
O 1536 x 1536, the fused gate/up 17920 x 1536 (here 4096 of its rows: the cost per output
column is the same), down 1536 x 8960), random blocks with small float16 scales, m rows of
x: seconds per call (lower quartile of the process's CPU time at 1 thread, which other
programs on a shared machine inflate less than wall time; wall time at more threads) and
GOP/s (2 m n k operations per call). ``--repacked`` repacks the weight by 8 rows first
(kernels/repacked.py: the avx2 default). ``INFERPATH_ISA`` picks the level.

    python benchmarks/prefill_gemm.py [--formats Q4_K,Q6_K] [--threads 1] [--rows 512]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import inferpath  # noqa: F401  (before torch: the thread wait policy, threads.py)
import torch
from gguf import GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).parent))
from quant_kernels import random_blocks, timed  # noqa: E402

from inferpath.kernels import build, ops  # noqa: E402

SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (4096, 1536), "down": (1536, 8960),
          "k256": (4096, 256), "k512": (4096, 512), "k768": (4096, 768)}  # (the last three: the panel in L1 or not)


def repack(data: torch.Tensor, qtype: GGMLQuantizationType, cols: int) -> tuple[torch.Tensor, int]:
    """data's rows repacked by 8 (kernels/repacked.py), and the format id the kernels take."""
    from inferpath.kernels import repacked
    from inferpath.weights.quantized import QuantizedTensor

    packed = repacked.repack(QuantizedTensor(data, qtype, (data.shape[0], cols)), drop_source=False)
    return packed.data, packed.kernel_type


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="Q4_K,Q6_K")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--repacked", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fn = build.native_quant_matmul()
    results = []
    for qname in args.formats.split(","):
        qtype = GGMLQuantizationType[qname]
        for shape in args.shapes.split(","):
            n, k = SHAPES[shape]
            data, code = random_blocks(qtype, n, k), int(qtype)
            if args.repacked:
                data, code = repack(data, qtype, k)
            x = torch.randn(args.rows, k)
            seconds = timed(lambda i: ops.run_quant_matmul(fn, x, data, code, None, n), args.threads, args.calls)
            gops = 2 * args.rows * n * k / seconds / 1e9
            results.append({"format": qname, "shape": shape, "n": n, "k": k, "seconds": seconds, "gop_s": gops})
            print(f"{qname:5} {shape:8} {n:5}x{k:<5} {seconds * 1e3:8.1f} ms  {gops:6.1f} GOP/s", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"level": build.kernel_level("quantized"), "threads": args.threads,
                                              "rows": args.rows, "repacked": args.repacked, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
