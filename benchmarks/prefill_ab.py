"""512-token prefill A/B (or another vs_llamacpp.py task): inferpath source trees and llama.cpp, alternating in fresh processes.

Each round runs every engine once, in turn, each in a fresh process through
``vs_llamacpp.py --worker`` (the same load, warm-up and 512-token prompt as that script's
prefill task; ``--task decode`` its decode after a short prompt, and so on). An inferpath engine is ``NAME=SRC_DIR[@ISA]``: its worker runs with
``PYTHONPATH=SRC_DIR`` (a checkout's ``src``; native kernels build per source hash) and
``INFERPATH_ISA=ISA`` where given. Prints each engine's median tok/s and its ratio to
llama.cpp and to the first engine, and writes JSON (``--out``). The machine may be shared:
the medians and same-run ratios are the figures, one sample is not.

    python benchmarks/prefill_ab.py --model PATH.gguf --engines this=src,base=/tmp/base/src,llamacpp \\
        [--threads 2] [--rounds 3] [--task prefill] [--out benchmarks/results/x.json]
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

SCRIPT = Path(__file__).with_name("vs_llamacpp.py")


def run_worker(engine: str, model: str, threads: int, task: str = "prefill") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "INFERPATH_ISA"}  # llama.cpp keeps PYTHONPATH (its build)
    worker = "llamacpp"
    if engine != "llamacpp":
        worker = "inferpath"
        src, _, isa = engine.split("=", 1)[1].partition("@")
        env["PYTHONPATH"] = str(Path(src).resolve())
        if isa:
            env["INFERPATH_ISA"] = isa
    command = [sys.executable, str(SCRIPT), "--worker", worker, "--model", model, "--task", task,
               "--threads", str(threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"{engine} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--engines", required=True, help="comma-separated: NAME=SRC[@ISA] or llamacpp")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--task", default="prefill", help="a vs_llamacpp.py task: prefill, decode, deep, ...")
    parser.add_argument("--warmup", action="store_true", help="one unrecorded run of each first (kernel builds)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    engines = args.engines.split(",")
    names = [e.split("=", 1)[0] for e in engines]
    if args.warmup:
        for engine in engines:
            run_worker(engine, args.model, args.threads, args.task)
    samples: dict[str, list[float]] = {name: [] for name in names}
    loads = [os.getloadavg()]
    for r in range(args.rounds):
        for name, engine in zip(names, engines):
            result = run_worker(engine, args.model, args.threads, args.task)
            samples[name].append(result[f"{args.task}_tok_s"])
            print(f"round {r + 1} {name:10} {samples[name][-1]:7.1f} {args.task} tok/s", flush=True)
        loads.append(os.getloadavg())
    medians = {name: statistics.median(v) for name, v in samples.items()}
    for name in names:
        vs_first = medians[name] / medians[names[0]]
        vs_llama = f"  {medians[name] / medians['llamacpp']:.2f}x llama.cpp" if "llamacpp" in medians else ""
        print(f"{name:10} median {medians[name]:7.1f} tok/s  {vs_first:.3f}x {names[0]}{vs_llama}")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "model": args.model, "task": args.task, "threads": args.threads, "rounds": args.rounds, "engines": dict(zip(names, engines)),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_average": loads,
            "llamacpp_pythonpath": os.environ.get("PYTHONPATH", ""),  # which llama.cpp build ran (a GGML_NATIVE=OFF folder)
            "medians_tok_s": medians, "samples_tok_s": samples}, indent=2))


if __name__ == "__main__":
    main()
