"""A quantized row kernel alone, in GB/s of the weight bytes it reads, batch-1 (one row of x).

Per format and matrix shape (a 1.5B model's: the MLP's 8960 x 1536 and 1536 x 8960, the LM
head's 151936 x 1536), random blocks with small float16 scales, one row of x:

- "memory": copies of the weight cycled past the caches (at least 300 MB in all), so each
  call streams its weights from memory, as a decode step does; against the read bandwidth
  measured here at the same thread count (a 256 MB float32 sum);
- "L2": one 512 x 1536 weight (~0.45 MB) called again and again: the kernel's own rate,
  the memory out of the way (the call's ctypes and x-quantization overhead included).

Times are the lower quartile (1 thread: of the process's CPU time, which a shared machine's
other programs do not inflate; more threads: of wall time). Prints a table and writes
benchmarks/results/quant_kernels.json (or ``--out``). ``INFERPATH_ISA`` picks the level.

    python benchmarks/quant_kernels.py [--formats Q4_K,Q6_K] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import inferpath  # noqa: F401  (before torch: OMP_WAIT_POLICY=PASSIVE, as every entry point; threads.py)
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from inferpath.kernels import build, ops

SHAPES = [(8960, 1536), (1536, 8960), (151936, 1536)]


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int) -> torch.Tensor:
    block, size = GGML_QUANT_SIZES[qtype]
    data = np.random.default_rng(0).integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    half = np.array([0.01], dtype=np.float16).view(np.uint8)
    for at in {GGMLQuantizationType.Q6_K: [208], GGMLQuantizationType.Q4_K: [0, 2],
               GGMLQuantizationType.Q5_K: [0, 2]}.get(qtype, [0]):
        data[:, :, at:at + 2] = half
    return torch.from_numpy(data.reshape(rows, -1))


def timed(call, threads: int, calls: int) -> float:
    clock = time.process_time if threads == 1 else time.perf_counter
    times = []
    for i in range(calls):
        start = clock()
        call(i)
        times.append(clock() - start)
    times = sorted(times[calls // 5:])  # the first fifth warms up
    return times[len(times) // 4]


def read_bandwidth(threads: int) -> float:
    torch.set_num_threads(threads)
    a = torch.ones(1 << 26)  # 256 MB
    return a.numel() * 4 / timed(lambda i: a.sum(), threads, 10)


def kernel_rate(qname: str, rows: int, cols: int, threads: int, hot: bool) -> float:
    qtype = GGMLQuantizationType[qname]
    first = random_blocks(qtype, rows, cols)
    copies = 1 if hot else max(1, (300 << 20) // first.numel())
    weights = [first] + [first.clone() for _ in range(copies - 1)]
    x, fn = torch.randn(1, cols), build.native_quant_matmul()
    torch.set_num_threads(threads)
    seconds = timed(lambda i: ops.run_quant_matmul(fn, x, weights[i % copies], int(qtype), None, rows), threads,
                    400 if hot else max(10, 5 * copies))
    return first.numel() / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="Q4_K,Q6_K,Q5_K,Q8_0,Q5_0")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--out", default=str(Path(__file__).with_name("results") / "quant_kernels.json"))
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    level = build.kernel_level("quantized")
    bandwidth = {t: read_bandwidth(t) for t in threads}
    print(f"level {level}; read bandwidth " + ", ".join(f"{t} threads {b / 1e9:.1f} GB/s" for t, b in bandwidth.items()))
    results = {"level": level, "read_bandwidth": bandwidth, "kernels": []}
    for qname in args.formats.split(","):
        rate = kernel_rate(qname, 512, 1536, 1, hot=True)
        results["kernels"].append({"format": qname, "shape": [512, 1536], "threads": 1, "from": "L2", "bytes_per_s": rate})
        print(f"{qname:5} 512 x 1536 from L2, 1 thread: {rate / 1e9:6.2f} GB/s")
        for rows, cols in SHAPES:
            for t in threads:
                rate = kernel_rate(qname, rows, cols, t, hot=False)
                results["kernels"].append({"format": qname, "shape": [rows, cols], "threads": t, "from": "memory",
                                           "bytes_per_s": rate})
                print(f"{qname:5} {rows} x {cols} from memory, {t} threads: {rate / 1e9:6.2f} GB/s "
                      f"({rate / bandwidth[t]:.0%} of the read bandwidth)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
