"""Variants of the native kernels' sources against each other, in one process, calls alternating.

Each variant is a copy of ``src/inferpath/kernels/csrc`` (edited: a tile size, a loop
order); each is compiled at the avx512 level with build.py's flags into its own library,
and ``inferpath_quant_matmul`` of every variant is called in turn, round after round, on
the same random weight (benchmarks/quant_kernels.py's blocks) and 512 rows of x, at one
thread. Times are the process's CPU time; a shared machine's other programs drift over
a run, and alternating call by call puts each variant under the same drift. Prints per
shape each variant's GOP/s (2 m n k per call, medians), its ratio to the first variant,
and whether its output equals the first's to the bit; ``--out`` writes JSON.

    python benchmarks/gemm_source_ab.py --variants /tmp/a/csrc,/tmp/b/csrc \\
        [--shapes 4096x1536,1536x8960] [--formats Q4_K,Q6_K] [--rounds 7] [--rows 512] [--repacked]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import inferpath  # noqa: F401  (before torch: the thread wait policy, threads.py)
import torch
from gguf import GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).parent))
from quant_kernels import random_blocks  # noqa: E402

from inferpath.kernels import build  # noqa: E402


def compile_variant(csrc: Path, workdir: Path):
    """csrc's avx512-level library (cached in workdir by a hash of its sources) -> its quant matmul."""
    files = sorted(p for d in ("avx512", "quant", "drivers") for p in (csrc / d).iterdir() if p.suffix == ".c")
    digest = hashlib.sha256()
    for p in sorted(p for d in ("avx512", "quant", "drivers") for p in (csrc / d).iterdir()):
        digest.update(p.name.encode() + p.read_bytes())
    target = workdir / f"variant-{digest.hexdigest()[:16]}.so"
    if not target.exists():
        flags = [*build.COMMON_FLAGS, *build.LEVELS[-1].flags]
        subprocess.run(["gcc", *flags, *map(str, files), "-o", str(target), "-lm"], check=True)
    fn = ctypes.CDLL(str(target)).inferpath_quant_matmul
    p, i, n = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    fn.argtypes, fn.restype = [n, p, i, p, p, p, i, i, i, n, n], n
    return fn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", required=True, help="comma-separated csrc directories; the first is the base")
    parser.add_argument("--shapes", default="4096x1536,1536x8960", help="OUTxIN, comma-separated")
    parser.add_argument("--formats", default="Q4_K,Q6_K")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", type=int, default=512, help="rows of x (a prompt's tokens, a batch's rows)")
    parser.add_argument("--repacked", action="store_true", help="the weights repacked by 8 rows (kernels/repacked.py)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    variants = [Path(v) for v in args.variants.split(",")]
    workdir = Path(tempfile.gettempdir()) / "inferpath-gemm-ab"
    workdir.mkdir(exist_ok=True)
    fns = [compile_variant(v, workdir) for v in variants]
    torch.set_num_threads(1)
    results = []
    for qname in args.formats.split(","):
        qtype = GGMLQuantizationType[qname]
        for shape in args.shapes.split(","):
            n, k = map(int, shape.split("x"))
            w, x, code = random_blocks(qtype, n, k), torch.randn(args.rows, k), int(qtype)
            if args.repacked:
                from prefill_gemm import repack

                w, code = repack(w, qtype, k)
            outs = [torch.empty(args.rows, n) for _ in fns]
            times: list[list[float]] = [[] for _ in fns]
            for r in range(args.rounds + 1):  # round 0 warms up
                for v, fn in enumerate(fns):
                    start = time.process_time()
                    status = fn(code, w.data_ptr(), w.shape[1], x.data_ptr(), None, outs[v].data_ptr(),
                                args.rows, n, k, 1, 0)
                    elapsed = time.process_time() - start
                    if status != 0:
                        raise RuntimeError(f"{variants[v]} rejected {qname} {shape} (status {status})")
                    if r:
                        times[v].append(elapsed)
            medians = [statistics.median(t) for t in times]
            row = {"format": qname, "shape": shape, "variants": [
                {"csrc": str(v), "gop_s": 2 * args.rows * n * k / m / 1e9, "ratio": medians[0] / m,
                 "equal_to_first": bool(torch.equal(outs[i], outs[0])), "seconds": times[i]}
                for i, (v, m) in enumerate(zip(variants, medians))]}
            results.append(row)
            print(f"{qname} {shape}: " + "  ".join(
                f"{Path(r['csrc']).parent.name}/{Path(r['csrc']).name} {r['gop_s']:.0f} GOP/s ({r['ratio']:.3f}x"
                f"{', equal' if r['equal_to_first'] else ', DIFFERS'})" for r in row["variants"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": args.rows, "threads": 1, "rounds": args.rounds, "runs": results},
                                             indent=2))


if __name__ == "__main__":
    main()
