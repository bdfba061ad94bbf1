"""The cost of per-request batch invariance (``--deterministic-seeded``), same run.

With ``EngineConfig(deterministic_seeded=True)`` the rows of requests that set a seed run
as a batch-invariant sub-batch of each step and the others keep the fast kernels
(engine/row_passes.py): a step holding both is two forwards. This measures, on SmolLM2-135M
(its default Q4_1 GGUF, sampled at temperature 0.8, ``ignore_eos``), for batches that mix
U unseeded and S seeded requests, the prompt time of the batch and ``--steps`` decode
steps, the flag's engine and a default engine on the same batch alternating step by step
(drifting load falls on both); median and 10th-percentile step times, their ratios, and the
median of the step-by-step ratios (each flag step over the default step before it).

Every row of a step waits for the whole step, so the step ratio is the cost to the
unseeded rows and to the seeded ones alike; the mix with S = 0 is what the flag costs
when nobody sets a seed, the one with U = 0 what invariant kernels cost seeded rows alone.

Prints a table, writes benchmarks/results/seeded_rows.json. No assertions.

    python benchmarks/seeded_rows.py [--steps 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
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

sys.path.insert(0, str(Path(__file__).parent))
from batch_invariant import TOPICS, drain, machine  # noqa: E402  (a sibling script)

MODEL = "smollm2-135m-instruct"
MIXES = ((16, 0), (15, 1), (13, 3), (4, 1), (0, 16))  # (unseeded, seeded) requests
RESULTS = Path(__file__).parent / "results"


def add(engine: LLMEngine, unseeded: int, seeded: int, tag: str, max_tokens: int) -> float:
    """Queue the mix (unseeded first, seeded after) and run its prompt steps; returns their
    seconds."""
    for i in range(unseeded + seeded):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.8, ignore_eos=True,
                                seed=1000 + i if i >= unseeded else None)
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


def measure(engines: dict[str, LLMEngine], unseeded: int, seeded: int, steps: int, tag: str) -> dict:
    prompt = {mode: add(engine, unseeded, seeded, f"{tag}-{mode}", steps + 4) for mode, engine in engines.items()}
    times: dict[str, list[float]] = {mode: [] for mode in engines}
    for _ in range(steps):
        for mode, engine in engines.items():
            t0 = time.perf_counter()
            engine.step()
            times[mode].append(time.perf_counter() - t0)
    for engine in engines.values():
        drain(engine)
    row: dict = {"unseeded": unseeded, "seeded": seeded}
    for mode in engines:
        ordered = sorted(times[mode])
        row[f"{mode}_decode_step_ms"] = 1000 * statistics.median(ordered)
        row[f"{mode}_decode_step_ms_p10"] = 1000 * ordered[len(ordered) // 10]
        row[f"{mode}_prompt_s"] = prompt[mode]
    row["decode_ratio"] = row["seeded_flag_decode_step_ms"] / row["default_decode_step_ms"]
    row["decode_ratio_p10"] = row["seeded_flag_decode_step_ms_p10"] / row["default_decode_step_ms_p10"]
    # each flag step over the default step just before it: drift cancels pair by pair
    row["decode_paired_ratio"] = statistics.median(f / d for f, d in zip(times["seeded_flag"], times["default"]))
    row["prompt_ratio"] = row["seeded_flag_prompt_s"] / row["default_prompt_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="decode steps timed per engine and mix")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engines = {mode: LLMEngine.from_model(MODEL, EngineConfig(
        max_num_seqs=16, threads=args.threads, deterministic_seeded=mode == "seeded_flag",
        enable_prefix_caching=False)) for mode in ("default", "seeded_flag")}
    measure(engines, 1, 1, 3, "warmup")
    rows = []
    for unseeded, seeded in MIXES:
        rows.append(measure(engines, unseeded, seeded, args.steps, f"u{unseeded}s{seeded}"))
        print(f"mix {unseeded}+{seeded} done", file=sys.stderr, flush=True)

    where = machine()
    print(f"{MODEL} (Q4_1 GGUF), {args.threads} threads; {where}; load {os.getloadavg()[0]:.1f}")
    print(f"{'unseeded':>8} {'seeded':>6} {'step ms':>8} {'flag':>7} {'ratio':>6} {'p10 ratio':>9} "
          f"{'paired':>6} {'prompt s':>9} {'flag':>7} {'ratio':>6}")
    for r in rows:
        print(f"{r['unseeded']:>8} {r['seeded']:>6} {r['default_decode_step_ms']:>8.1f} "
              f"{r['seeded_flag_decode_step_ms']:>7.1f} {r['decode_ratio']:>6.2f} {r['decode_ratio_p10']:>9.2f} {r['decode_paired_ratio']:>6.2f} "
              f"{r['default_prompt_s']:>9.3f} {r['seeded_flag_prompt_s']:>7.3f} {r['prompt_ratio']:>6.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "seeded_rows.json"
    path.write_text(json.dumps({
        "model": MODEL, "threads": args.threads, "decode_steps": args.steps, "machine": where,
        "kernels": kernel_status(), "load_average": os.getloadavg(), "rows": rows}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
