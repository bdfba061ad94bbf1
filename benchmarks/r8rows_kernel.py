"""r8.c's kernel alone (repacked Q4_K / Q6_K) at 1..8 rows of x, against another source tree.

Per format, rows of x and dispatch ("r8": every row through r8.c, the row-invariant
dispatch; "auto": the default, gemm.c's panels from R8_GEMM_MIN_ROWS rows), the lower
quartile of process CPU time per call at 1 thread (a shared machine's other programs do not
inflate it; at ``--threads 2`` and more, of wall time) of a weight from L2 ("hot": 512 x
1536, the kernel's own rate) or streamed from memory ("memory": copies cycled past the
caches, a decode step's case). ``--cases model``: the 1.5B file's shapes (1536 x 1536,
8960 x 1536, 1536 x 8960) in Q4_K and Q6_K, streamed; ``--cases legacy``: the packaged 0.5B
and SmolLM2 files' Q8_0 LM heads, Q5_0 and Q4_1 MLP shapes, streamed. The level is the build's best unless
``INFERPATH_ISA`` forces one (the children inherit it). With ``--against
SRC`` (another checkout's src/) each round runs this tree and that one in turn, in
subprocesses, and the medians over rounds are compared: A/B on the same machine, interleaved.

    python benchmarks/r8rows_kernel.py [--against /tmp/base/src] [--rounds 3] [--rows 1,2,3,5,8]
        [--threads 1] [--cases default|model] [--out benchmarks/results/r8rows_kernel.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {"default": [("Q4_K", 512, 1536, "hot"), ("Q6_K", 512, 1536, "hot"), ("Q4_K", 8960, 1536, "memory"),
                     ("Q6_K", 1536, 8960, "memory")],
         "model": [(qname, n, k, "memory") for qname in ("Q4_K", "Q6_K")
                   for n, k in ((1536, 1536), (8960, 1536), (1536, 8960))],
         # the 32-value formats of the packaged files, streamed: the 0.5B's Q8_0 LM head and
         # Q5_0 MLP, SmolLM2's Q8_0 LM head and Q4_1 MLP
         "legacy": [("Q8_0", 151936, 896, "memory"), ("Q5_0", 4864, 896, "memory"), ("Q5_0", 896, 4864, "memory"),
                    ("Q8_0", 49152, 576, "memory"), ("Q4_1", 1536, 576, "memory")]}


def one_process(rows_list: list[int], threads: int = 1, cases: str = "default") -> dict:
    """This process's figures: {case: {rows: {dispatch: seconds}}}."""
    import inferpath  # noqa: F401  (before torch: OMP_WAIT_POLICY=PASSIVE)
    import torch
    from gguf import GGMLQuantizationType
    from quant_kernels import random_blocks

    from inferpath.kernels import build, ops
    from inferpath.weights.quantized import QuantizedTensor
    from inferpath.kernels.repacked import repack
    from inferpath.model.batch_invariant import row_invariant_dispatch

    torch.set_num_threads(threads)
    clock = time.process_time if threads == 1 else time.perf_counter
    fn, out = build.native_quant_matmul(), {}
    for qname, n, k, where in CASES[cases]:
        qtype = GGMLQuantizationType[qname]
        packed = repack(QuantizedTensor(random_blocks(qtype, n, k), qtype, (n, k)), drop_source=False)
        copies = 1 if where == "hot" else max(1, (300 << 20) // packed.data.numel())
        weights = [packed.data] + [packed.data.clone() for _ in range(copies - 1)]
        calls = 300 if where == "hot" else max(20, 3 * copies)
        case = out.setdefault(f"{qname} {n}x{k} {where}", {})
        for rows in rows_list:
            x = torch.randn(rows, k)
            for dispatch in ("r8", "auto"):
                times = []
                for i in range(calls):
                    start = clock()
                    if dispatch == "r8":
                        with row_invariant_dispatch():
                            ops.run_quant_matmul(fn, x, weights[i % copies], packed.kernel_type, None, n)
                    else:
                        ops.run_quant_matmul(fn, x, weights[i % copies], packed.kernel_type, None, n)
                    times.append(clock() - start)
                times = sorted(times[calls // 5:])
                case.setdefault(str(rows), {})[dispatch] = times[len(times) // 4]
    return {"level": build.kernel_level("quantized"), "threads": threads, "figures": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="another checkout's src/ to compare with, interleaved")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default="1,2,3,4,5,6,8")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", choices=sorted(CASES), default="default")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(Path(__file__).with_name("results") / "r8rows_kernel.json"))
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.child:
        print(json.dumps(one_process(rows, args.threads, args.cases)))
        return
    here = str(Path(__file__).resolve().parents[1] / "src")
    trees = {"this": here} | ({"against": args.against} if args.against else {})
    runs: dict = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, src in trees.items():
            env = dict(os.environ, PYTHONPATH=f"{src}:{Path(__file__).parent}")
            done = subprocess.run([sys.executable, __file__, "--child", "--rows", args.rows, "--threads",
                                   str(args.threads), "--cases", args.cases], env=env,
                                  capture_output=True, text=True, check=True)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    results = {"level": runs["this"][0]["level"], "threads": args.threads, "rounds": args.rounds, "trees": trees,
               "cases": {}}
    for case in runs["this"][0]["figures"]:
        for r in rows:
            row = {}
            for name in trees:
                for dispatch in ("r8", "auto"):
                    row[f"{name}_{dispatch}_us"] = round(1e6 * statistics.median(
                        run["figures"][case][str(r)][dispatch] for run in runs[name]), 1)
            if args.against:
                row["r8_this_vs_against"] = round(row["this_r8_us"] / row["against_r8_us"], 3)
                row["auto_this_vs_against"] = round(row["this_auto_us"] / row["against_auto_us"], 3)
            results["cases"].setdefault(case, {})[str(r)] = row
            print(case, r, "  ".join(f"{key} {value}" for key, value in row.items()), flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
