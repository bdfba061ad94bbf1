"""Load time and resident memory of one GGUF file: inferpath against llama.cpp.

Each load runs in a fresh process of its own; the two engines alternate, repeat after
repeat, and medians are reported. Per engine:

- load s: ``LLMEngine.from_model`` (inferpath) or ``Llama(...)`` (llama.cpp), timed in
  the worker after its imports; cpu s: the process's CPU time over the same span (steadier
  than the wall clock on a busy machine);
- baseline MB: the worker's resident memory after its imports, before the load
  (inferpath imports PyTorch: ~220 MB before any model);
- peak MB: the worker's peak resident memory after the load;
- model MB: peak - baseline, what the load itself added.

The target (issue 9): load <= 2x llama.cpp's seconds; resident memory <= 1.5x the file
plus the KV cache (32 MiB here for inferpath; llama.cpp's n_ctx=1024 context is 30 MiB).
inferpath's first load of a file parses and checks it and caches an index (weights/
gguf_index.py); ``--cold`` clears that cache before every inferpath run.

    python benchmarks/load.py [--repeats 5] [--model PATH] [--engines inferpath,llamacpp] [--cold]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).with_name("results")
KV_BYTES = 32 * 2**20


def rss_mb(field: str = "VmRSS") -> float:
    """The process's current (VmRSS) or peak (VmHWM) resident memory, MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(engine: str, path: str, threads: int) -> dict:
    if engine == "llamacpp":
        from llama_cpp import Llama

        baseline = rss_mb()
        start, cpu = time.perf_counter(), time.process_time()
        llm = Llama(model_path=path, n_ctx=1024, n_threads=threads, verbose=False)
    else:
        import inferpath  # noqa: F401  (before torch: threads.py)
        from inferpath.config import EngineConfig
        from inferpath.engine.llm_engine import LLMEngine

        baseline = rss_mb()
        start, cpu = time.perf_counter(), time.process_time()
        llm = LLMEngine.from_model(path, EngineConfig(threads=threads, max_num_seqs=64,
                                                      kv_cache_memory_bytes=KV_BYTES))
    load_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    peak = rss_mb("VmHWM")
    del llm
    return {"load_s": load_s, "cpu_s": cpu_s, "baseline_mb": baseline, "peak_mb": peak, "model_mb": peak - baseline}


def clear_index_cache() -> None:
    from inferpath.weights.gguf_index_cache import index_cache_dir

    for entry in index_cache_dir().glob("*"):
        entry.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["inferpath", "llamacpp"])
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engines", default="inferpath,llamacpp")
    parser.add_argument("--cold", action="store_true", help="clear inferpath's index cache before each run")
    parser.add_argument("--out", default=str(RESULTS / "load.json"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.threads)))
        return
    from inferpath.models import resolve_model

    path = args.model or str(resolve_model("smollm2-135m-instruct"))
    samples: dict[str, dict[str, list[float]]] = {}
    for repeat in range(args.repeats):
        for engine in args.engines.split(","):
            if engine == "inferpath" and args.cold:
                clear_index_cache()
            command = [sys.executable, __file__, "--worker", engine, "--model", path,
                       "--threads", str(args.threads)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{engine} failed:\n{done.stderr[-2000:]}")
            got = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{engine} #{repeat}: {got}", file=sys.stderr, flush=True)
            for name, value in got.items():
                samples.setdefault(engine, {}).setdefault(name, []).append(value)
    size_mb = Path(path).stat().st_size / 2**20
    target_mb = 1.5 * size_mb + KV_BYTES / 2**20
    summary = {engine: {name: statistics.median(v) for name, v in m.items()} for engine, m in samples.items()}
    result = {"model": path, "file_mb": size_mb, "target_model_mb": target_mb, "repeats": args.repeats,
              "cold": args.cold, "cpu": _cpu(), "engines": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"{result['cpu']}; {Path(path).name} ({size_mb:.0f} MiB); medians of {args.repeats}"
          f"{', index cache cleared before each inferpath run' if args.cold else ''}")
    print(f"{'engine':10} {'load s':>7} {'ratio':>6} {'cpu s':>6} {'ratio':>6} {'baseline MB':>12} {'peak MB':>8} {'model MB':>9} "
          f"{'/ target':>8}")
    peer = summary.get("llamacpp")
    for engine, m in summary.items():
        ratio = m["load_s"] / peer["load_s"] if peer else float("nan")
        cpu_ratio = m["cpu_s"] / peer["cpu_s"] if peer else float("nan")
        print(f"{engine:10} {m['load_s']:7.3f} {ratio:6.2f} {m['cpu_s']:6.3f} {cpu_ratio:6.2f} {m['baseline_mb']:12.0f} {m['peak_mb']:8.0f} "
              f"{m['model_mb']:9.0f} {m['model_mb'] / target_mb:8.2f}")
    print(f"target: load <= 2.00x llama.cpp; model MB <= 1.5 x file + KV = {target_mb:.0f} MB")


def _cpu() -> str:
    """The CPU's model name and its vector flags."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return f"{model} ({', '.join(sorted(f for f in flags if f.startswith(('avx', 'amx', 'fma', 'f16c'))))})"


if __name__ == "__main__":
    main()
