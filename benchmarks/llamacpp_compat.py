"""Does llama.cpp load the GGUF files ``inferpath quantize`` writes, and read them as inferpath does?

Not a test (CI has no llama.cpp): a check to run where ``llama-cpp-python`` is installed
(the ``bench`` extra). For each model, float GGUFs (BF16, F16) are made from its packaged
quantized file by llama.cpp's own quantizer (a requantization: the values are the
packaged file's, dequantized); ``inferpath quantize`` turns each into Q8_0, Q4_0 and Q4_K
files. Per file:

- llama.cpp loads it (in a process of its own: a refused file may abort it) and says what
  it holds (``llama_model_desc``: architecture, size, file type);
- both engines compute the logits of every position of the same token ids (teacher
  forced, one pass): top-1 agreement, max |difference| and the same relative to the
  largest logit, inferpath against llama.cpp, as each runs by default;
- exact reading: llama.cpp's own F32 dequantization of the file (float32 KV cache)
  against inferpath's float32 path on the file: with no rounding of activations on
  either side the logits agree to float32 rounding if both decode the blocks alike;
- quality: top-1 agreement of the quantized model with the float source (llama.cpp's
  logits on both), for inferpath's quantizer and, in the same run, llama.cpp's own
  quantization of the same source to the same type.

The float sources and the packaged file are checked the same way (inferpath's BF16 path
against llama.cpp's, and the BF16 file against the packaged file it was made from).

    python benchmarks/llamacpp_compat.py [--models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).with_name("results")
TYPES = ("Q8_0", "Q4_0", "Q4_K")
SOURCES = ("BF16", "F16")
NUM_POSITIONS = 128


def llamacpp_ftype(name: str) -> int:
    import llama_cpp

    return {"F32": llama_cpp.LLAMA_FTYPE_ALL_F32, "BF16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16, "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
            "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
            "Q4_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S}[name]


def llamacpp_quantize(source: Path, target: Path, name: str) -> Path:
    """``target``: ``source`` converted by llama.cpp's quantizer to ``name`` (made once)."""
    import llama_cpp

    if not target.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = llamacpp_ftype(name), True, 2
        if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params) != 0:
            raise RuntimeError(f"llama.cpp could not write {target}")
    return target


def inferpath_quantize(source: Path, target: Path, name: str) -> dict:
    """``inferpath quantize SOURCE TARGET --type NAME``, run as a user runs it."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "inferpath", "quantize", str(source), str(target), "--type", name],
                          capture_output=True, text=True, timeout=1200, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"inferpath quantize {source} -> {name} failed:\n{done.stderr[-2000:]}")
    return {"seconds": time.perf_counter() - start, "says": done.stdout.strip().splitlines()[-1]}


def text_ids(path: Path, count: int) -> list[int]:
    """``count`` token ids of real English text, by inferpath's tokenizer of the file."""
    import argparse as text_source

    from inferpath.tokenizer import load_tokenizer

    ids = load_tokenizer(path).encode(text_source.__doc__)
    if len(ids) < count:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than {count}")
    return ids[:count]


# ---------------------------------------------------------------- logits of each engine
def worker_llamacpp(path: str, ids: list[int], out: str, threads: int, float32_cache: bool) -> dict:
    """llama.cpp's logits of every position (written to ``out`` as .npy) and what it says
    the file holds; its KV cache in float32 where asked (float16 by default)."""
    import ctypes

    import llama_cpp

    cache = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if float32_cache else {}
    llm = llama_cpp.Llama(model_path=path, n_ctx=max(256, len(ids)), n_batch=len(ids), n_threads=threads,
                          n_threads_batch=threads, logits_all=True, verbose=False, **cache)
    llm.eval(ids)
    np.save(out, np.asarray(llm.scores[:len(ids)], dtype=np.float32))
    desc = ctypes.create_string_buffer(128)
    llama_cpp.llama_model_desc(llm.model, desc, len(desc))
    return {"desc": desc.value.decode(), "file_type": llm.metadata.get("general.file_type"),
            "quantization_version": llm.metadata.get("general.quantization_version")}


def llamacpp_logits(path: Path, ids: list[int], threads: int,
                    float32_cache: bool = False) -> tuple[np.ndarray | None, dict]:
    """(logits (len(ids), vocab) or None where llama.cpp refused the file, what it said)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "ids.json").write_text(json.dumps(ids))
        out = Path(tmp) / "logits.npy"
        done = subprocess.run([sys.executable, __file__, "--worker", str(path), "--ids", str(Path(tmp) / "ids.json"),
                               "--out", str(out), "--threads", str(threads)] + (["--float32-cache"] if float32_cache else []),
                              capture_output=True, text=True, timeout=1200, check=False)
        if done.returncode != 0:
            return None, {"refused": done.stderr.strip().splitlines()[-5:]}
        return np.load(out), json.loads(done.stdout.strip().splitlines()[-1])


def inferpath_logits(path: Path, ids: list[int], threads: int, dtype: str = "auto") -> tuple[np.ndarray, str]:
    """inferpath's logits of every position in one prefill pass of the engine's model
    (``dtype="auto"``: what ``inferpath generate`` runs), and its weight format."""
    import torch

    from inferpath.config import EngineConfig
    from inferpath.engine.llm_engine import LLMEngine
    from inferpath.model.metadata import one_sequence_metadata

    engine = LLMEngine.from_model(str(path), EngineConfig(threads=threads, kv_cache_memory_bytes=64 * 2**20,
                                                                   dtype=dtype))
    cache = engine.kv_cache
    meta = one_sequence_metadata(0, len(ids), -(-len(ids) // cache.block_size), cache.block_size)
    with torch.inference_mode():
        hidden = engine.runner.model(torch.tensor(ids), torch.arange(len(ids)), cache, meta)
        logits = engine.runner.model.compute_logits(hidden).float().numpy()  # (len(ids), vocab)
    return logits, engine.weight_format.describe()


def agreement(logits: np.ndarray, reference: np.ndarray) -> dict:
    """How ``logits`` (positions, vocab) read against ``reference``."""
    diff = np.abs(logits - reference)
    return {"top1": float((logits.argmax(-1) == reference.argmax(-1)).mean()), "max_abs": float(diff.max()),
            "max_rel": float(diff.max() / np.abs(reference).max()),
            "rms_rel": float(np.sqrt((diff ** 2).mean() / (reference ** 2).mean()))}


def top1(logits: np.ndarray | None, reference: np.ndarray | None) -> float | None:
    if logits is None or reference is None:
        return None
    return float((logits.argmax(-1) == reference.argmax(-1)).mean())


def exact_read(path: Path, ids: list[int], threads: int) -> dict:
    """Do both engines read the same weights from ``path``? llama.cpp dequantizes the file
    to F32 (its own block decoders) and runs it with a float32 KV cache; inferpath runs
    ``path`` dequantized to float32 by the ``gguf`` package. With no quantized activations
    on either side the logits agree to float32 rounding (~1e-6) when the weights do."""
    with tempfile.TemporaryDirectory() as tmp:
        dequantized = llamacpp_quantize(path, Path(tmp) / "f32.gguf", "F32")
        theirs, said = llamacpp_logits(dequantized, ids, threads, float32_cache=True)
    if theirs is None:
        return {"refused": said["refused"]}
    ours, _ = inferpath_logits(path, ids, threads, dtype="float32")
    return agreement(ours, theirs)


# ---------------------------------------------------------------- driver
def check_model(alias: str, workdir: Path, types: list[str], sources: list[str], threads: int) -> list[dict]:
    from inferpath.models import resolve_model

    packaged = Path(resolve_model(alias))
    ids = text_ids(packaged, NUM_POSITIONS)
    rows: list[dict] = []

    def check(path: Path, written_by: str, float_reference: np.ndarray | None, **extra):
        theirs, said = llamacpp_logits(path, ids, threads)
        ours, runs = inferpath_logits(path, ids, threads)
        row = {"model": alias, "file": path.name, "written_by": written_by, "size_mb": path.stat().st_size / 1e6,
               "llamacpp": said, "inferpath_runs": runs, **extra}
        if theirs is not None:
            row["inferpath_vs_llamacpp"] = agreement(ours, theirs)
            row["top1_vs_float_source"] = top1(theirs, float_reference)
            row["exact_read"] = exact_read(path, ids, threads)
        rows.append(row)
        print(f"{alias} {path.name}: {json.dumps(row)}", file=sys.stderr, flush=True)
        return theirs, ours

    packaged_logits, _ = check(packaged, "packaged", None)
    # the packaged file dequantized to float32 by inferpath: what a float copy of it must give
    dequantized, _ = inferpath_logits(packaged, ids, threads, dtype="float32")
    for source_type in sources:
        source = llamacpp_quantize(packaged, workdir / f"{packaged.stem}.{source_type}.gguf", source_type)
        source_logits, ours = check(source, "llama.cpp", packaged_logits)
        rows[-1]["inferpath_vs_packaged_dequantized"] = agreement(ours, dequantized)
        for qtype in types:
            ours = workdir / f"{packaged.stem}.{source_type}.{qtype}.inferpath.gguf"
            quantized = inferpath_quantize(source, ours, qtype)
            check(ours, "inferpath quantize", source_logits, quantize=quantized)
            theirs = llamacpp_quantize(source, workdir / f"{packaged.stem}.{source_type}.{qtype}.llamacpp.gguf", qtype)
            check(theirs, "llama.cpp", source_logits)
    return rows


def machine() -> dict:
    from inferpath.explain.probe import cpu_model
    from inferpath.kernels import build

    flags = sorted(f for f in build._cpu_flags() if f.startswith(("avx", "amx", "fma", "f16c")))
    return {"cpu": cpu_model(), "flags": flags, "cores": os.cpu_count()}


def print_table(results: dict) -> None:
    info = results["machine"]
    print(f"{info['cpu']} ({', '.join(info['flags'])}); {NUM_POSITIONS} teacher-forced positions, "
          f"{results['threads']} threads")
    print(f"{'file':52} {'written by':18} {'MB':>6} {'llama.cpp says':24} {'top-1':>6} {'rel':>6} "
          f"{'exact':>8} {'vs float':>8}")
    for row in results["rows"]:
        said = row["llamacpp"].get("desc") or "REFUSED: " + " | ".join(row["llamacpp"]["refused"])
        run, exact = row.get("inferpath_vs_llamacpp"), row.get("exact_read", {})
        figures = f"{run['top1']:6.1%} {run['max_rel']:6.2%}" if run else f"{'':6} {'':6}"
        exact_rel = f"{exact['max_rel']:8.1e}" if "max_rel" in exact else f"{'refused' if exact else '':>8}"
        vs_float = row.get("top1_vs_float_source")
        print(f"{row['file'][-52:]:52} {row['written_by']:18} {row['size_mb']:6.1f} {said[:24]:24} {figures} "
              f"{exact_rel} {'' if vs_float is None else f'{vs_float:.1%}':>8}")
    print("top-1, rel: inferpath's logits (--dtype auto) against llama.cpp's (its defaults: activations quantized "
          "to 8 bits for quantized weights, float16 KV cache) on the same file, max |diff| / max |logit|;\n"
          "exact: the same with no rounding on either side (llama.cpp's F32 dequantization of the file, float32 "
          "KV cache; inferpath float32): do both read the same weights;\n"
          "vs float: llama.cpp's top-1 on the file against its float source (the float files: against the "
          "packaged file)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m-instruct")
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--sources", default=",".join(SOURCES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", help="(internal) a file for llama.cpp to read")
    parser.add_argument("--ids", help="(internal) token ids, a JSON file")
    parser.add_argument("--float32-cache", action="store_true", help="(internal) llama.cpp's KV cache in float32")
    parser.add_argument("--out", default=str(RESULTS / "llamacpp_compat.json"))
    args = parser.parse_args()
    if args.worker:
        ids = json.loads(Path(args.ids).read_text())
        print(json.dumps(worker_llamacpp(args.worker, ids, args.out, args.threads, args.float32_cache)))
        return
    workdir = Path(os.environ.get("INFERPATH_CACHE", "~/.cache/inferpath")).expanduser() / "bench"
    workdir.mkdir(parents=True, exist_ok=True)
    results = {"machine": machine(), "threads": args.threads, "rows": []}
    for alias in args.models.split(","):
        results["rows"] += check_model(alias, workdir, args.types.split(","), args.sources.split(","), args.threads)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print_table(results)


if __name__ == "__main__":
    main()
