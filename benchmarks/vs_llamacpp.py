"""inferpath against llama.cpp (llama-cpp-python) on the same GGUF files.

Each measurement runs in a fresh process of its own (load time and resident memory are
per process), and the two engines alternate, repeat after repeat, so that whatever else
the machine is doing slows both alike; medians are reported. Per file and engine:
load seconds, peak resident MB, batch-1 greedy decode tok/s after a short prompt and
("deep") after the 512-token prompt (attention over a long context; "deepN" after N tokens),
512-token prefill tok/s ("prefillN": an N-token prompt, an agent's);
for inferpath also batch 8 and 32 aggregate decode tok/s. inferpath runs at its best
instruction-set level and with INFERPATH_ISA=avx2 forced (llama.cpp is built for this
CPU once; it cannot be forced per run). The floor: a decode step reads the weights once,
so tok/s <= read bandwidth / bytes per token.

    pip install -e '.[bench]'   # llama-cpp-python: compiles llama.cpp (~15 min on 2 cores)
    python benchmarks/vs_llamacpp.py [--threads 2] [--repeats 3] [--busy]

Files: the packaged Q4_1 SmolLM2, and Q8_0 and BF16 versions of it made by llama.cpp's
quantizer (``llama_cpp.llama_model_quantize``, requantizing from Q4_1: the same shapes
and bytes per weight as a Q8_0/BF16 conversion; the quality of the values is not
measured here); "Qwen": the packaged Qwen2.5-Coder-0.5B file as published, whose tensors
mix Q5_0, Q8_0, Q4_K and Q6_K (a real download's mix); "Qwen1.5B": Qwen2.5-Coder-1.5B-Instruct
Q4_K_M as published (Q4_K + Q6_K, 1.12 GB: the format most downloads are in, at the size
people run; pulled when first asked for). ``--formats`` picks the files, ``--tasks`` the
measurements (e.g. ``--formats Qwen1.5B --tasks decode --threads 1``).
``--busy`` runs a niced busy loop beside every measurement.

To hold llama.cpp to a lower level too (its native build takes the CPU's best), build it into
a folder of its own with ``GGML_NATIVE=OFF`` and put that first on ``PYTHONPATH``:

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF" \
        pip install --no-deps --no-build-isolation --target DIR llama-cpp-python==0.3.36
    PYTHONPATH=DIR python benchmarks/vs_llamacpp.py --engines llamacpp,inferpath-avx2 ...

and for the avxvnni level (AVX2 + AVX-VNNI: Intel's client cores, Zen 5) the same with
``-DGGML_AVX_VNNI=ON`` into another folder, against ``--engines llamacpp,inferpath-avxvnni``
(without build isolation pip needs ``scikit-build-core`` installed first).

The JSON's ``llamacpp_build`` says which build ran (its path and its own system info).

``--engines ...,inferpath-kvbf16`` runs inferpath with its KV cache in bf16
(``--kv-cache-dtype bfloat16``), beside llama.cpp's default f16 cache: with
``--tasks deep,deep2048`` the long-context decode, where the cache's bytes join the weights'.
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

RESULTS = Path(__file__).with_name("results")
# The environment before inferpath is imported here: importing it sets OMP_WAIT_POLICY=PASSIVE
# (threads.py), which must not reach the llama.cpp workers (their OpenMP pool would sleep
# between its parallel sections: llama.cpp's decode measured 42 instead of ~135 tok/s).
WORKER_ENV = dict(os.environ)
DECODE_TOKENS = 64
PREFILL_TOKENS = 512


def context_of(task: str) -> int:
    """The prompt a task decodes after: "deep" PREFILL_TOKENS, "deepN" N tokens (a long
    context, where the KV cache's bytes join the weights'), else 0."""
    if task == "deep":
        return PREFILL_TOKENS
    return int(task.removeprefix("deep")) if task.startswith("deep") else 0


def prefill_of(task: str) -> int:
    """The prompt a prefill task computes: "prefill" PREFILL_TOKENS, "prefillN" N tokens (an
    agent's long prompt, where attention's work grows with the square), else 0."""
    if task == "prefill":
        return PREFILL_TOKENS
    return int(task.removeprefix("prefill")) if task.startswith("prefill") else 0


def prompt_tokens(task: str) -> int:
    """The longest prompt a task reads from the ids file."""
    return max(context_of(task), prefill_of(task))
BATCH_TOKENS = 32
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def prompt_ids(path: str, count: int) -> list[int]:
    """``count`` token ids of real text in the file's own vocabulary (the prefill prompt).
    Workers read them from the file the driver writes (``ids_file``): the llama.cpp worker
    never imports inferpath."""
    cached = ids_file(path)
    if cached.exists():
        return json.loads(cached.read_text())[:count]
    import argparse as text_source

    from inferpath.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(Path(path))
    ids: list[int] = []
    while len(ids) < count:
        ids += tokenizer.encode(text_source.__doc__)
    return ids[:count]


def bench_dir() -> Path:
    return Path(os.environ.get("INFERPATH_CACHE", "~/.cache/inferpath")).expanduser() / "bench"


def ids_file(path: str) -> Path:
    return bench_dir() / f"{Path(path).stem}.prefill-ids.json"


def write_prompt_ids(path: str, longest: int = PREFILL_TOKENS) -> None:
    ids_file(path).unlink(missing_ok=True)
    ids_file(path).write_text(json.dumps(prompt_ids(path, max(PREFILL_TOKENS, longest))))


def peak_rss_mb() -> float:
    """Peak resident MB of this process's memory (VmHWM). Not getrusage's ru_maxrss: Linux
    carries that over exec from the forking process, so a worker reported the driver's peak
    whenever it was higher (every engine and file read 1644 MB after the 1.5B file's prompt
    was tokenized in the driver; the "unexplained" 1651 MB of 2026-12-06)."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def rss_mb() -> float:
    """Resident MB now: a worker's baseline after its imports, before it loads the model."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


# ---------------------------------------------------------------- workers (one process each)
def worker_llamacpp(path: str, task: str, threads: int, flash_attn: bool = False) -> dict:
    from llama_cpp import Llama

    context, prefill = context_of(task), prefill_of(task)
    ids = prompt_ids(path, prompt_tokens(task))  # before the baseline
    baseline = rss_mb()
    start = time.perf_counter()
    llm = Llama(model_path=path, n_ctx=max(1024, prompt_tokens(task) + DECODE_TOKENS + 64), n_batch=512,
                n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn, verbose=False)
    result = {"load_s": time.perf_counter() - start, "baseline_mb": baseline}
    if prefill:
        start = time.perf_counter()
        llm.eval(ids)
        result[f"{task}_tok_s"] = prefill / (time.perf_counter() - start)
    else:  # decode after a short prompt, or "deep"/"deepN": after the 512- or N-token prompt
        llm.eval(ids if context else llm.tokenize(PROMPT.encode()))
        token = llm.sample(temp=0.0)
        start = time.perf_counter()
        for _ in range(DECODE_TOKENS):
            llm.eval([token])
            token = llm.sample(temp=0.0)
        result[f"{task}_tok_s"] = DECODE_TOKENS / (time.perf_counter() - start)
    result["rss_mb"] = peak_rss_mb()
    result["model_mb"] = result["rss_mb"] - baseline  # what the model and its runs added
    return result


def worker_inferpath(path: str, task: str, threads: int, dtype: str = "auto", kv_cache_dtype: str = "auto") -> dict:
    import inferpath  # noqa: F401  (before torch: the thread wait policy, threads.py)
    from inferpath.config import EngineConfig
    from inferpath.engine.llm_engine import LLMEngine
    from inferpath.sampling.params import SamplingParams
    from inferpath.threads import physical_cores

    # KV cache sized like llama.cpp's n_ctx=1024 context (its resident memory includes it too)
    kv_bytes = (96 if task.startswith("batch") else 32) * 2**20
    if prompt_tokens(task) > PREFILL_TOKENS:  # room for the long prompt in float32 (a 1.5B file's token: 57 KB)
        kv_bytes = (prompt_tokens(task) + 2 * DECODE_TOKENS) * 64 * 1024
    baseline = rss_mb()  # torch and inferpath imported: ~220 MB before any model
    start = time.perf_counter()
    # as many threads as the physical cores: inferpath's default (threads=None), which also
    # measures one-sequence decode at 1 thread (threads.py DecodeThreadTuner)
    engine = LLMEngine.from_model(path, EngineConfig(threads=None if threads == physical_cores() else threads,
                                                     max_num_seqs=64, kv_cache_memory_bytes=kv_bytes, dtype=dtype,
                                                     kv_cache_dtype=kv_cache_dtype))
    result = {"load_s": time.perf_counter() - start, "baseline_mb": baseline, "format": engine.weight_format.describe(),
              "plan": engine.weight_plan.describe() if engine.weight_plan is not None else None,
              "decode_bytes": engine.weight_format.decode_bytes, "kv_mb": kv_bytes / 2**20}

    def run(prompts, max_tokens):
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, params)
        done = []
        while engine.has_unfinished_requests():
            done += [o for o in engine.step() if o.finished]
        return done

    run([PROMPT], 4)  # warm up
    if prefill_of(task):
        ids = prompt_ids(path, prefill_of(task))
        start = time.perf_counter()
        run([ids], 1)
        result[f"{task}_tok_s"] = prefill_of(task) / (time.perf_counter() - start)
    elif task == "decode" or context_of(task):  # "deep"/"deepN": decode after the 512- or N-token prompt
        (out,) = run([prompt_ids(path, context_of(task)) if context_of(task) else PROMPT], DECODE_TOKENS + 1)
        result[f"{task}_tok_s"] = DECODE_TOKENS / (out.metrics.finished_time - out.metrics.first_token_time)
    else:  # batchN
        batch = int(task.removeprefix("batch"))
        outs = run([f"{PROMPT} ({i})" for i in range(batch)], BATCH_TOKENS + 1)
        first = max(o.metrics.first_token_time for o in outs)
        last = max(o.metrics.finished_time for o in outs)
        result[f"{task}_tok_s"] = batch * BATCH_TOKENS / (last - first)
    result["rss_mb"] = peak_rss_mb()
    result["model_mb"] = result["rss_mb"] - baseline  # what the model and its runs added
    return result


# ---------------------------------------------------------------- driver
# engine key -> (worker, INFERPATH_ISA or None, the worker's own flags)
ENGINES = {
    "llamacpp": ("llamacpp", None, ()),  # its KV cache in f16, llama.cpp's default
    # flash attention on: llama-cpp-python's default is off, llama.cpp's own tools' "auto" turns it on
    "llamacpp-fa": ("llamacpp", None, ("--flash-attn",)),
    "inferpath": ("inferpath", None, ()),
    "inferpath-avx2": ("inferpath", "avx2", ()),
    "inferpath-avxvnni": ("inferpath", "avxvnni", ()),  # AVX2 + AVX-VNNI (Intel client cores, Zen 5)
    "inferpath-fp32": ("inferpath", None, ("--dtype", "float32")),  # the file dequantized: inferpath before this work
    "inferpath-kvbf16": ("inferpath", None, ("--kv-cache-dtype", "bfloat16")),  # the KV cache in bf16
}


def measure(key: str, path: str, task: str, threads: int, busy: bool) -> dict:
    worker, isa, flags = ENGINES[key]
    env = dict(WORKER_ENV)
    env.pop("INFERPATH_ISA", None)
    if isa:
        env["INFERPATH_ISA"] = isa
    command = [sys.executable, __file__, "--worker", worker, "--model", path, "--task", task,
               "--threads", str(threads), *flags]
    hog = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    if done.returncode != 0:
        raise RuntimeError(f"{key} {task} on {path} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def make_files(source: Path, workdir: Path) -> dict[str, str]:
    """Q8_0 and BF16 versions of the Q4_1 file, by llama.cpp's own quantizer."""
    import llama_cpp

    files = {"Q4_1": str(source)}
    for name, ftype in (("Q8_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0), ("BF16", llama_cpp.LLAMA_FTYPE_MOSTLY_BF16)):
        target = workdir / f"{source.stem}.{name}.gguf"
        if not target.exists():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.allow_requantize, params.nthread = ftype, True, 2
            if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params) != 0:
                raise RuntimeError(f"llama.cpp could not write {target}")
        files[name] = str(target)
    return files


def machine() -> dict:
    from inferpath.explain.probe import probe_this_machine
    from inferpath.kernels import build

    flags = sorted(f for f in build._cpu_flags() if f.startswith(("avx", "amx", "fma", "f16c")))
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "?")
    return {"cpu": model, "flags": flags, "cores": os.cpu_count(),
            "read_bandwidth": probe_this_machine().memory_bandwidth}


def llamacpp_build() -> str:
    """The llama.cpp build the workers import (its ISA: a native AVX-512 build, or one made
    with GGML_NATIVE=OFF for another level, first on PYTHONPATH), as it prints itself."""
    code = "import llama_cpp; print(llama_cpp.__file__, llama_cpp.llama_print_system_info().decode())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=WORKER_ENV)
    return done.stdout.strip() or done.stderr.strip()[-300:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["inferpath", "llamacpp"])
    parser.add_argument("--model")
    parser.add_argument("--task", default="decode")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", action="store_true", help="a niced busy loop beside every run")
    parser.add_argument("--formats", default="Q4_1,Q8_0,BF16,Qwen", help="of Q4_1, Q8_0, BF16, Qwen, Qwen1.5B")
    parser.add_argument("--tasks", default="decode,deep,prefill",
                        help="of decode, deep (after 512 tokens), deepN (after N tokens), prefill (512 tokens), "
                             "prefillN (N tokens), batchN "
                             "(inferpath only: N rows decoding at once)")
    parser.add_argument("--engines", default="llamacpp,inferpath,inferpath-avx2",
                        help=f"comma-separated, of {', '.join(ENGINES)}")
    parser.add_argument("--dtype", default="auto", help="(worker) inferpath's dtype")
    parser.add_argument("--kv-cache-dtype", default="auto", help="(worker) inferpath's KV cache dtype")
    parser.add_argument("--flash-attn", action="store_true", help="(worker) llama.cpp with flash attention")
    parser.add_argument("--out", default=str(RESULTS / "vs_llamacpp.json"))
    args = parser.parse_args()
    if args.worker:
        if args.worker == "llamacpp":
            print(json.dumps(worker_llamacpp(args.model, args.task, args.threads, args.flash_attn)))
        else:
            print(json.dumps(worker_inferpath(args.model, args.task, args.threads, args.dtype, args.kv_cache_dtype)))
        return

    from inferpath.models import resolve_model

    import torch

    torch.set_num_threads(args.threads)  # the read bandwidth of the floor: at the threads measured
    info = machine()
    workdir = bench_dir()
    workdir.mkdir(parents=True, exist_ok=True)
    keys = args.engines.split(",")
    source = Path(resolve_model("smollm2-135m-instruct"))
    with_llamacpp = any(ENGINES[key][0] == "llamacpp" for key in keys)
    files = make_files(source, workdir) if with_llamacpp else {"Q4_1": str(source)}
    files["Qwen"] = str(resolve_model("qwen2.5-coder-0.5b-instruct"))
    if "Qwen1.5B" in args.formats.split(","):  # 1.12 GB: pulled only when asked for
        files["Qwen1.5B"] = str(resolve_model("qwen2.5-coder-1.5b-instruct"))
    results: dict = {"machine": info, "threads": args.threads, "busy": args.busy, "repeats": args.repeats,
                     "load_average": os.getloadavg(), "llamacpp_build": llamacpp_build() if with_llamacpp else None,
                     "files": {}}
    for fmt in args.formats.split(","):
        path = files[fmt]
        tasks = set(args.tasks.split(","))
        write_prompt_ids(path, max(map(prompt_tokens, tasks)))
        samples: dict = {}
        for repeat in range(args.repeats):
            for key in keys:
                batched = sorted(t for t in tasks if t.startswith("batch"))
                if not batched and fmt == "Q4_1" and not args.busy:
                    batched = ["batch8", "batch32"]  # the default run's batched rows: SmolLM2
                plain = sorted(t for t in tasks if not t.startswith("batch"))
                for task in plain + (batched if key == "inferpath" else []):
                    got = measure(key, path, task, args.threads, args.busy)
                    for name, value in got.items():
                        if name in ("rss_mb", "model_mb") and task != "decode":  # the table's memory: decode's
                            name = f"{task}_{name}"
                        samples.setdefault(key, {}).setdefault(name, []).append(value)
                    print(f"{fmt} {key} {task} #{repeat}: {got}", file=sys.stderr, flush=True)
        summary = {key: {name: (statistics.median(v) if isinstance(v[0], (int, float)) else v[0])
                         for name, v in metrics.items()} for key, metrics in samples.items()}
        size_mb = Path(path).stat().st_size / 1e6
        # the bytes a decode step reads are the file's (its weights but the embedding table):
        # inferpath's count serves llama.cpp's floor too
        step_bytes = next((m["decode_bytes"] for m in summary.values() if "decode_bytes" in m), None)
        for key, m in summary.items():
            if step_bytes and "decode_tok_s" in m:
                floor = info["read_bandwidth"] / step_bytes
                m["floor_tok_s"], m["floor_fraction"] = floor, m["decode_tok_s"] / floor
        # issue 9's target: what the model adds <= 1.5x the file + the KV cache (32 MiB for decode)
        target_mb = 1.5 * Path(path).stat().st_size / 2**20 + 32
        results["files"][fmt] = {"path": path, "size_mb": size_mb, "target_model_mb": target_mb, "engines": summary,
                                 "samples": samples}  # every repeat, in order: how noisy the medians are
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print_table(results)


def print_table(results: dict) -> None:
    info = results["machine"]
    print(f"{info['cpu']} ({', '.join(info['flags'])}), {results['threads']} threads"
          f"{', one busy process beside' if results['busy'] else ''}; read bandwidth "
          f"{info['read_bandwidth'] / 1e9:.1f} GB/s; medians of {results['repeats']}")
    print("ratios: against llama.cpp (or, without it, inferpath-fp32: the file dequantized)")
    header = f"{'file':8} {'engine':16} {'decode tok/s':>12} {'ratio':>6} {'deep tok/s':>10} {'ratio':>6} " \
             f"{'prefill tok/s':>13} {'ratio':>6} " \
             f"{'load s':>7} {'RSS MB':>7} {'base MB':>7} {'model MB':>8} {'floor':>6}"
    print(header)
    for fmt, entry in results["files"].items():
        base = (entry["engines"].get("llamacpp") or entry["engines"].get("llamacpp-fa")
                or entry["engines"].get("inferpath-fp32", {}))
        for key, m in entry["engines"].items():
            dr = m.get("decode_tok_s", 0) / base["decode_tok_s"] if base.get("decode_tok_s") else float("nan")
            pr = m.get("prefill_tok_s", 0) / base["prefill_tok_s"] if base.get("prefill_tok_s") else float("nan")
            deep = m.get("deep_tok_s", 0) / base["deep_tok_s"] if base.get("deep_tok_s") else float("nan")
            floor = f"{m['floor_fraction']:.0%}" if "floor_fraction" in m else ""
            print(f"{fmt:8} {key:16} {m.get('decode_tok_s', 0):12.1f} {dr:6.2f} {m.get('deep_tok_s', 0):10.1f} "
                  f"{deep:6.2f} {m.get('prefill_tok_s', 0):13.1f} "
                  f"{pr:6.2f} {m.get('load_s', 0):7.2f} {m.get('rss_mb', 0):7.0f} {m.get('baseline_mb', 0):7.0f} "
                  f"{m.get('model_mb', 0):8.0f} {floor:>6}")
            for deep in sorted((n.removesuffix("_tok_s") for n in m if n.startswith("deep") and n != "deep_tok_s"
                                and n.endswith("_tok_s")), key=context_of):
                ratio = f" ({m[f'{deep}_tok_s'] / base[f'{deep}_tok_s']:.2f}x)" if base.get(f"{deep}_tok_s") else ""
                print(f"{'':6} {key:16} decode after {context_of(deep)} tokens: {m[f'{deep}_tok_s']:.1f} tok/s{ratio}")
            for prefill in sorted((n.removesuffix("_tok_s") for n in m if n.startswith("prefill") and n != "prefill_tok_s"
                                   and n.endswith("_tok_s")), key=prefill_of):
                ratio = f" ({m[f'{prefill}_tok_s'] / base[f'{prefill}_tok_s']:.2f}x)" if base.get(f"{prefill}_tok_s") else ""
                print(f"{'':6} {key:16} prefill of {prefill_of(prefill)} tokens: {m[f'{prefill}_tok_s']:.1f} tok/s{ratio}")
            for batch in sorted((n.removesuffix("_tok_s") for n in m if n.startswith("batch") and n.endswith("_tok_s")),
                                key=lambda n: int(n.removeprefix("batch"))):
                ratio = f" ({m[f'{batch}_tok_s'] / m['decode_tok_s']:.1f}x its batch 1)" if "decode_tok_s" in m else ""
                print(f"{'':6} {key:16} {batch}: {m[f'{batch}_tok_s']:.1f} tok/s aggregate{ratio}")
        print(f"{'':6} file {entry['size_mb']:.1f} MB; target: model MB (peak RSS - RSS after imports) <= "
              f"1.5 x file + KV = {entry.get('target_model_mb', 0):.0f} MB")


if __name__ == "__main__":
    main()
