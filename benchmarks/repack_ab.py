"""Weights repacked by 8 rows against the file's layout (INFERPATH_REPACK=1 / 0), with
llama.cpp as the peer, in the same run. Each measurement is a fresh process of
vs_llamacpp.py's workers; per round the three alternate (repack on, off, llama.cpp), so
whatever else the machine does slows them alike; medians over the rounds. Per file,
level (INFERPATH_ISA) and thread count: the task's tok/s and resident MB.
    python benchmarks/repack_ab.py --formats Qwen1.5B,Qwen --threads 2,1 --isa best,avx2 \
        --task prefill --rounds 3 --out benchmarks/results/<name>.json
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


def measure(engine: str, path: str, task: str, threads: int, isa: str, repack: str | None) -> dict:
    bench.WORKER_ENV.pop("INFERPATH_REPACK", None)
    if repack is not None:
        bench.WORKER_ENV["INFERPATH_REPACK"] = repack
    key = "llamacpp" if engine == "llamacpp" else ("inferpath-avx2" if isa == "avx2" else "inferpath")
    return bench.measure(key, path, task, threads, busy=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="Qwen1.5B,Qwen", help="of Qwen (0.5B), Qwen1.5B")
    parser.add_argument("--threads", default="2,1")
    parser.add_argument("--isa", default="best,avx2", help="best (the CPU's level) and/or avx2")
    parser.add_argument("--task", default="prefill", help="a vs_llamacpp.py task: prefill, decode, deep, batch8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-llamacpp", action="store_true", help="leave the peer out (it has no ISA switch)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from inferpath.models import resolve_model

    names = {"Qwen": "qwen2.5-coder-0.5b-instruct", "Qwen1.5B": "qwen2.5-coder-1.5b-instruct"}
    metric = f"{args.task}_tok_s"
    results = {"machine": bench.machine(), "task": args.task, "rounds": args.rounds,
               "load_average_start": os.getloadavg(), "runs": []}
    for fmt in args.formats.split(","):
        path = str(resolve_model(names[fmt]))
        bench.bench_dir().mkdir(parents=True, exist_ok=True)
        bench.write_prompt_ids(path)
        for threads in (int(t) for t in args.threads.split(",")):
            for isa in args.isa.split(","):
                engines = [("repack", "1"), ("laid-out", "0")]
                if not args.no_llamacpp and isa == "best":
                    engines.append(("llamacpp", None))
                samples: dict = {name: [] for name, _ in engines}
                for r in range(args.rounds):
                    for name, flag in engines:
                        got = measure(name, path, args.task, threads, isa, flag)
                        samples[name].append(got)
                        print(f"{fmt} {threads}t {isa} {name} #{r}: {got[metric]:.1f} tok/s, "
                              f"{got.get('format', '')}", file=sys.stderr, flush=True)
                medians = {name: {m: statistics.median(s[m] for s in runs) for m in (metric, "rss_mb", "model_mb")}
                           for name, runs in samples.items()}
                row = {"format": fmt, "path": path, "file_mb": Path(path).stat().st_size / 2**20, "threads": threads,
                       "isa": isa, "medians": medians, "samples": samples,
                       "repack_vs_laid_out": medians["repack"][metric] / medians["laid-out"][metric]}
                if "llamacpp" in medians:
                    row["repack_vs_llamacpp"] = medians["repack"][metric] / medians["llamacpp"][metric]
                results["runs"].append(row)
    results["load_average_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    cpu = results["machine"]["cpu"]
    print(f"{args.task}, {cpu}, load {results['load_average_start'][0]:.1f} -> {results['load_average_end'][0]:.1f}, "
          f"medians of {args.rounds} alternating rounds (tok/s; model MB = peak RSS - baseline)")
    print(f"{'file':9} {'thr':>3} {'isa':5} {'repack':>8} {'laid out':>8} {'llama.cpp':>9} {'ratio':>6} {'vs llama':>8} "
          f"{'MB r/l':>11}")
    for row in results["runs"]:
        m = row["medians"]
        peer = m.get("llamacpp", {}).get(metric)
        print(f"{row['format']:9} {row['threads']:>3} {row['isa']:5} {m['repack'][metric]:8.1f} "
              f"{m['laid-out'][metric]:8.1f} {peer if peer else float('nan'):9.1f} {row['repack_vs_laid_out']:6.2f} "
              f"{row.get('repack_vs_llamacpp', float('nan')):8.2f} "
              f"{m['repack']['model_mb']:5.0f}/{m['laid-out']['model_mb']:<5.0f}")


if __name__ == "__main__":
    main()
