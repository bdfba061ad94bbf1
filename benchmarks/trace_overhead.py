"""What tracing costs a step: engine decode steps with the trace off and on, alternated.

SmolLM2-135M-Instruct (its packaged Q4_1 GGUF by default) through LLMEngine with its
native kernels and the native decode call. For each batch size, the same requests run
untraced and traced (``engine.trace.trace``) in alternation, ``--repeats`` times each, so
whatever else the machine does slows both alike; the figure is the median decode-step time
of each and their ratio (the budget: at most 1.05x), with the load average before each round. Native decode is checked, not
assumed: every decode step, traced or not, must have taken the native call (counted at
the call), and every traced decode step's record must say so (``StepRecord.native_decode``:
its stage buffer filled); otherwise the run stops with an error instead of a figure of the
module path. Prints a table and writes the JSON ``--out`` names with the
machine's CPU flags. No assertions on time: the machine is shared and noisy.

    python benchmarks/trace_overhead.py --out benchmarks/results/NEW.json [--threads 2] [--dtype auto] [--tokens 32]
        [--repeats 5] [--cpu-time]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import inferpath  # noqa: F401  (before torch: OMP_WAIT_POLICY=PASSIVE, as every entry point; threads.py)
import torch

from inferpath.config import EngineConfig
from inferpath.engine import LLMEngine
from inferpath.engine.trace import trace
from inferpath.explain.probe import cpu_flags, cpu_model, kernel_level
from inferpath.sampling.params import SamplingParams

MODEL = "smollm2-135m-instruct"
RESULTS = Path(__file__).parent / "results"


def decode_step_times(engine: LLMEngine, batch: int, tokens: int, tag: str, native: list[bool],
                      cpu_time: bool = False) -> list[float]:
    """Wall times (``cpu_time``: the process's CPU time) of the steps after every request's
    prefill; ``native`` gets, per such step, whether its layers ran in the native decode call."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"{tag}-{i}", f"Story number {i}: once upon a time", params)
    times, calls = [], []
    stack = engine.runner.model.model
    clock = time.process_time if cpu_time else time.perf_counter
    while engine.has_unfinished_requests():
        stack.native_calls_seen = 0
        start = clock()
        engine.step()
        times.append(clock() - start)
        calls.append(stack.native_calls_seen > 0)
    native += calls[batch:]
    return times[batch:]  # the first steps hold the prefills


def count_native_calls(engine: LLMEngine) -> None:
    """Count, on the decode stack, the steps that really ran the native call."""
    stack = engine.runner.model.model
    if not hasattr(stack, "native_decode_refusal") or stack.native_decode_refusal():
        reason = stack.native_decode_refusal() if hasattr(stack, "native_decode_refusal") else "no native kernels"
        raise SystemExit(f"native decode is not in use for {MODEL} here ({reason}): this benchmark measures "
                         "the trace on the native path and has nothing to measure")
    original = stack._decode_natively

    def counting(*args):
        hidden = original(*args)
        stack.native_calls_seen += hidden is not None
        return hidden
    stack._decode_natively = counting


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="alternating rounds (untraced, traced) a batch size")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--cpu-time", action="store_true",
                        help="time each step by the process's CPU time, not wall time: with --threads 1 on a "
                             "machine other processes load, the step's own work (pool workers' spinning "
                             "counts too with more threads)")
    parser.add_argument("--out", type=Path, required=True,
                        help="the JSON to write (a new name under benchmarks/results/)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = LLMEngine.from_model(MODEL, EngineConfig(dtype=args.dtype, enable_prefix_caching=False,
                                                      threads=args.threads))
    count_native_calls(engine)
    decode_step_times(engine, 1, 4, "warmup", [])
    rows = []
    for batch in args.batches:
        plain, traced, plain_native, traced_native, recorded, loads = [], [], [], [], [], []
        for r in range(args.repeats):
            loads.append(os.getloadavg()[0])
            plain += decode_step_times(engine, batch, args.tokens, f"plain-{batch}-{r}", plain_native, args.cpu_time)
            with trace(engine) as tracer:
                before = len(tracer.all_steps())
                traced += decode_step_times(engine, batch, args.tokens, f"traced-{batch}-{r}", traced_native,
                                            args.cpu_time)
                recorded += [s.native_decode for s in tracer.all_steps()[before:] if not s.num_prefill_tokens]
        if not (all(plain_native) and all(traced_native) and all(recorded)):
            raise SystemExit(f"batch {batch}: native decode not in use: {plain_native.count(False)} of "
                             f"{len(plain_native)} untraced and {traced_native.count(False)} of {len(traced_native)} "
                             f"traced decode steps took the module path, {recorded.count(False)} traced records "
                             "without the native stage buffer: the figure would not measure the native path")
        p, t = statistics.median(plain), statistics.median(traced)
        rows.append({"batch": batch, "plain_step_ms": p * 1e3, "traced_step_ms": t * 1e3, "ratio": t / p,
                     # the fastest steps: under other processes' load, closer to the step's own cost
                     "plain_min_ms": min(plain) * 1e3, "traced_min_ms": min(traced) * 1e3,
                     "min_ratio": min(traced) / min(plain),
                     "native_decode_steps": len(plain_native) + len(traced_native),
                     # the 1-minute load average before each round (2 cores: above 2, others wait too)
                     "load_average": loads})
    print(f"{MODEL} {args.dtype}, {args.threads} threads, kernels {kernel_level()}, {cpu_model()}, "
          f"native decode in every decode step (checked); {'CPU' if args.cpu_time else 'wall'} time a step")
    print(f"{'batch':>5} {'untraced step':>14} {'traced step':>12} {'ratio':>6}   {'fastest: untraced':>17} "
          f"{'traced':>9} {'ratio':>6}   load average ({os.cpu_count()} CPUs)")
    for row in rows:
        load = row["load_average"]
        print(f"{row['batch']:>5} {row['plain_step_ms']:>11.2f} ms {row['traced_step_ms']:>9.2f} ms {row['ratio']:>6.3f}"
              f"   {row['plain_min_ms']:>14.2f} ms {row['traced_min_ms']:>6.2f} ms {row['min_ratio']:>6.3f}"
              f"   {min(load):.1f}-{max(load):.1f}")
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "model": MODEL, "dtype": args.dtype, "native_decode": True,
        "clock": "process CPU time" if args.cpu_time else "wall time", "threads": args.threads, "tokens": args.tokens,
        "repeats": args.repeats, "cpu": cpu_model(), "machine": platform.machine(),
        "kernel_level": kernel_level(), "cpu_flags": sorted(cpu_flags()), "cpus": os.cpu_count(), "rows": rows,
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
