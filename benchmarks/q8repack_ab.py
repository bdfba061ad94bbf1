"""Repacked weights with and without transparent huge pages, against the file's layout,
in the same run: per round, INFERPATH_REPACK=1 (huge pages advised, the default), =1 with
INFERPATH_REPACK_HUGEPAGES=0, and =0 alternate, each a fresh process of vs_llamacpp.py's
workers; medians over the rounds (tok/s).
    python benchmarks/q8repack_ab.py --format Qwen --threads 2 --isa best --tasks prefill,decode \
        --rounds 3 --out benchmarks/results/q8repack_<name>.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import vs_llamacpp as bench  # noqa: E402

VARIANTS = {"repack": {"INFERPATH_REPACK": "1"},
            "repack-4k": {"INFERPATH_REPACK": "1", "INFERPATH_REPACK_HUGEPAGES": "0"},
            "laid-out": {"INFERPATH_REPACK": "0"}}


def measure(variant: str, path: str, task: str, threads: int, isa: str) -> dict:
    for name in ("INFERPATH_REPACK", "INFERPATH_REPACK_HUGEPAGES"):
        bench.WORKER_ENV.pop(name, None)
    bench.WORKER_ENV.update(VARIANTS[variant])
    return bench.measure("inferpath-avx2" if isa == "avx2" else "inferpath", path, task, threads, busy=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", default="Qwen", help="Qwen (0.5B) or Qwen1.5B")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--isa", default="best")
    parser.add_argument("--tasks", default="prefill,decode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from inferpath.models import resolve_model

    names = {"Qwen": "qwen2.5-coder-0.5b-instruct", "Qwen1.5B": "qwen2.5-coder-1.5b-instruct"}
    path = str(resolve_model(names[args.format]))
    bench.bench_dir().mkdir(parents=True, exist_ok=True)
    bench.write_prompt_ids(path)
    results = {"machine": bench.machine(), "format": args.format, "threads": args.threads, "isa": args.isa,
               "rounds": args.rounds, "load_average_start": os.getloadavg(), "tasks": {}}
    for task in args.tasks.split(","):
        metric = f"{task}_tok_s"
        samples: dict = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            for variant in VARIANTS:
                got = measure(variant, path, task, args.threads, args.isa)
                samples[variant].append(got)
                print(f"{args.format} {task} {args.threads}t {args.isa} {variant} #{r}: {got[metric]:.1f} tok/s, "
                      f"model {got['model_mb']:.0f} MB", file=sys.stderr, flush=True)
        medians = {v: {m: statistics.median(s[m] for s in runs) for m in (metric, "model_mb")}
                   for v, runs in samples.items()}
        results["tasks"][task] = {"medians": medians, "samples": samples,
                                  "repack_vs_laid_out": medians["repack"][metric] / medians["laid-out"][metric],
                                  "repack_4k_vs_laid_out": medians["repack-4k"][metric] / medians["laid-out"][metric]}
        print(f"{task}: " + ", ".join(f"{v} {m[metric]:.1f}" for v, m in medians.items())
              + f"; repack/laid out {results['tasks'][task]['repack_vs_laid_out']:.2f}, 4k pages "
              f"{results['tasks'][task]['repack_4k_vs_laid_out']:.2f}", flush=True)
    results["load_average_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
