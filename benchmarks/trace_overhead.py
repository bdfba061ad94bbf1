"""What tracing costs a step: engine decode steps with the trace off and on, alternated.

SmolLM2-135M-Instruct through LLMEngine with its native kernels. For each batch size,
the same requests run untraced and traced (``engine.trace.trace``) in alternation,
``--repeats`` times each, so whatever else the machine does slows both alike; the figure
is the median decode-step time of each and their ratio (the issue's budget: at most
1.10). Prints a table and writes benchmarks/results/trace_overhead.json with the
machine's CPU flags. No assertions: the machine is shared and noisy.

    python benchmarks/trace_overhead.py [--threads 2] [--dtype float32] [--tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from inferpath.config import EngineConfig
from inferpath.engine import LLMEngine
from inferpath.engine.trace import trace
from inferpath.explain.probe import cpu_flags, cpu_model, kernel_level
from inferpath.sampling.params import SamplingParams

MODEL = "smollm2-135m-instruct"
RESULTS = Path(__file__).parent / "results"


def decode_step_times(engine: LLMEngine, batch: int, tokens: int, tag: str) -> list[float]:
    """Wall times of the steps after every request's prefill."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"{tag}-{i}", f"Story number {i}: once upon a time", params)
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return times[batch:]  # the first steps hold the prefills


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = LLMEngine.from_model(MODEL, EngineConfig(dtype=args.dtype, enable_prefix_caching=False))
    decode_step_times(engine, 1, 4, "warmup")
    rows = []
    for batch in args.batches:
        plain, traced = [], []
        for r in range(args.repeats):
            plain += decode_step_times(engine, batch, args.tokens, f"plain-{batch}-{r}")
            with trace(engine):
                traced += decode_step_times(engine, batch, args.tokens, f"traced-{batch}-{r}")
        p, t = statistics.median(plain), statistics.median(traced)
        rows.append({"batch": batch, "plain_step_ms": p * 1e3, "traced_step_ms": t * 1e3, "ratio": t / p})
    print(f"{MODEL} {args.dtype}, {args.threads} threads, kernels {kernel_level()}, {cpu_model()}")
    print(f"{'batch':>5} {'untraced step':>14} {'traced step':>12} {'ratio':>6}")
    for row in rows:
        print(f"{row['batch']:>5} {row['plain_step_ms']:>11.2f} ms {row['traced_step_ms']:>9.2f} ms {row['ratio']:>6.3f}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "trace_overhead.json"
    out.write_text(json.dumps({
        "model": MODEL, "dtype": args.dtype, "threads": args.threads, "tokens": args.tokens,
        "repeats": args.repeats, "cpu": cpu_model(), "machine": platform.machine(),
        "kernel_level": kernel_level(), "cpu_flags": sorted(cpu_flags()), "rows": rows,
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
