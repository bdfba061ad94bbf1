"""Batch-1 and batch-8 aggregate decode on the 1.5B Q4_K_M file, this tree against another,
interleaved: vs_llamacpp.py's inferpath worker (a fresh process per measurement) run in
turn with each tree's src/ on PYTHONPATH, ``--rounds`` times; medians and this/that ratios.

    INFERPATH_REPACK=1 python benchmarks/r8rows_batch.py --against /tmp/base/src [--rounds 2] [--threads 2]
        [--out benchmarks/results/r8rows_batch.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
MODEL = Path.home() / ".cache/inferpath/models/qwen2.5-coder-1.5b-instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="another checkout's src/")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tasks", default="decode,batch8")
    parser.add_argument("--out", default=str(HERE / "results" / "r8rows_batch.json"))
    args = parser.parse_args()
    trees = {"this": str(HERE.parent / "src"), "against": args.against}
    tasks = args.tasks.split(",")
    figures: dict = {name: {task: [] for task in tasks} for name in trees}
    for _ in range(args.rounds):
        for task in tasks:
            for name, src in trees.items():
                done = subprocess.run([sys.executable, str(HERE / "vs_llamacpp.py"), "--worker", "inferpath", "--model",
                                       str(MODEL), "--task", task, "--threads", str(args.threads)],
                                      env=dict(os.environ, PYTHONPATH=src), capture_output=True, text=True, check=True)
                got = json.loads(done.stdout.strip().splitlines()[-1])[f"{task}_tok_s"]
                figures[name][task].append(got)
                print(name, task, round(got, 2), flush=True)
    medians = {name: {task: statistics.median(v) for task, v in per.items()} for name, per in figures.items()}
    results = {"threads": args.threads, "repack": os.environ.get("INFERPATH_REPACK"), "trees": trees,
               "tok_s": figures, "median_tok_s": medians,
               "this_vs_against": {task: medians["this"][task] / medians["against"][task] for task in tasks},
               "batch_vs_decode": {name: {t: m[t] / m["decode"] for t in tasks if t != "decode"} for name, m in medians.items()}
               if "decode" in tasks else {}}
    print(json.dumps(results["this_vs_against"]), json.dumps(results["batch_vs_decode"]))
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
