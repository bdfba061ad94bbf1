"""The cost of batch-invariant mode: engine step time with and without it, same run.

``EngineConfig(batch_invariant=True)`` (``--deterministic``) makes a request's tokens and
logprobs independent of what shares its steps (model/batch_invariant.py). This measures
what that costs on SmolLM2-135M: for batch 1, 8 and 32 (greedy, ``ignore_eos``), the
prompt time of the batch (its prompt steps), then ``--steps`` decode steps of the batch,
default engine and batch-invariant engine on the same weights alternating step by step,
so drifting load falls on both; median and 10th-percentile step times.

Prints a table, writes benchmarks/results/batch_invariant[_DTYPE].json. No assertions.

    python benchmarks/batch_invariant.py [--dtype float32] [--steps 30] [--threads 2]
                                         [--no-cpu-kernels]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import inferpath  # noqa: F401  (before torch: OMP_WAIT_POLICY=PASSIVE, as every entry point; threads.py)
import torch

from inferpath.config import EngineConfig
from inferpath.engine import LLMEngine
from inferpath.kernels import kernel_status
from inferpath.sampling.params import SamplingParams

MODEL = "smollm2-135m-instruct"
BATCH_SIZES = (1, 8, 32)
RESULTS = Path(__file__).parent / "results"
TOPICS = ("rivers", "volcanoes", "bees", "clocks", "bridges", "comets", "deserts", "violins")


def machine() -> str:
    """CPU model and the vector extensions the kernels care about."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name in ("", platform.machine(), platform.processor()):
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
    return f"{name}; {os.cpu_count()} CPUs; " + " ".join(f for f in wanted if f in flags)


def add(engine: LLMEngine, n: int, tag: str, max_tokens: int) -> float:
    """Queue n prompts and run them through their prompt steps; returns the prompt seconds."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i in range(n):
        engine.add_request(f"{tag}-{i}", f"Write a short story number {i} about "
                                         f"{TOPICS[i % len(TOPICS)]} and the sea.", params)
    seconds = 0.0
    while True:
        before = engine.stats().num_prompt_tokens_computed
        t0 = time.perf_counter()
        engine.step()
        elapsed = time.perf_counter() - t0
        if engine.stats().num_prompt_tokens_computed == before:
            return seconds  # that step was a pure decode: the prompts are in
        seconds += elapsed


def drain(engine: LLMEngine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


def measure(engines: dict[str, LLMEngine], n: int, steps: int, tag: str) -> dict:
    """Prompt time of n requests in each engine, then ``steps`` decode steps of the n
    sequences, alternating engines step by step so that both see the same load."""
    prompt = {mode: add(engine, n, f"{tag}-{mode}", steps + 4) for mode, engine in engines.items()}
    times: dict[str, list[float]] = {mode: [] for mode in engines}
    for _ in range(steps):
        for mode, engine in engines.items():
            t0 = time.perf_counter()
            engine.step()
            times[mode].append(time.perf_counter() - t0)
    for engine in engines.values():
        drain(engine)
    row: dict = {"batch_size": n}
    for mode in engines:
        ordered = sorted(times[mode])
        row[f"{mode}_decode_step_ms"] = 1000 * statistics.median(ordered)
        row[f"{mode}_decode_step_ms_p10"] = 1000 * ordered[len(ordered) // 10]
        row[f"{mode}_prompt_s"] = prompt[mode]
    row["decode_slowdown"] = row["batch_invariant_decode_step_ms"] / row["default_decode_step_ms"]
    row["decode_slowdown_p10"] = row["batch_invariant_decode_step_ms_p10"] / row["default_decode_step_ms_p10"]
    row["prompt_slowdown"] = row["batch_invariant_prompt_s"] / row["default_prompt_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--steps", type=int, default=30, help="decode steps timed per engine and batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-cpu-kernels", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engines = {mode: LLMEngine.from_model(MODEL, EngineConfig(
        dtype=args.dtype, max_num_seqs=max(BATCH_SIZES), cpu_kernels=not args.no_cpu_kernels,
        batch_invariant=mode == "batch_invariant", enable_prefix_caching=False))
        for mode in ("default", "batch_invariant")}
    measure(engines, 2, 3, "warmup")
    rows = []
    for n in BATCH_SIZES:
        rows.append(measure(engines, n, args.steps, f"b{n}"))
        print(f"batch {n} done", file=sys.stderr, flush=True)

    where = machine()
    print(f"{MODEL} {args.dtype}, {args.threads} threads, kernels {'off' if args.no_cpu_kernels else 'on'}; {where}")
    print(f"{'batch':>5} {'step ms':>8} {'invariant':>10} {'ratio':>6} {'p10 ratio':>9} "
          f"{'prompt s':>9} {'invariant':>10} {'ratio':>6}")
    for r in rows:
        print(f"{r['batch_size']:>5} {r['default_decode_step_ms']:>8.1f} {r['batch_invariant_decode_step_ms']:>10.1f} "
              f"{r['decode_slowdown']:>6.2f} {r['decode_slowdown_p10']:>9.2f} {r['default_prompt_s']:>9.3f} "
              f"{r['batch_invariant_prompt_s']:>10.3f} {r['prompt_slowdown']:>6.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "batch_invariant" + ("" if args.dtype == "float32" else f"_{args.dtype}") + (
        "_no_kernels" if args.no_cpu_kernels else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps({
        "model": MODEL, "dtype": args.dtype, "threads": args.threads, "decode_steps": args.steps,
        "cpu_kernels": not args.no_cpu_kernels, "machine": where,
        "kernels": kernel_status(), "load_average": os.getloadavg(), "rows": rows}, indent=2))
    print(f"wrote {RESULTS / stem}.json")


if __name__ == "__main__":
    main()
