"""Encode throughput of our pure-Python BPE against Hugging Face ``tokenizers`` (one thread).

Text: 1 MB of English (the Python documentation's topic help, then standard-library
docstrings), tokenized with SmolLM2's tokenizer: ours from its GGUF, the reference built
from the same vocabulary and merges with the same pre-tokenizers. Both run in this process,
one after the other, best of ``--repeats``; the ratio is what to read (the machine is
shared). "cold" clears our per-pre-token cache first; "warm" encodes the text a second time.

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

from tokenizer_fixtures import model_gguf, smollm2_reference

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-bytes", type=int, default=1_000_000)
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "tokenizer.json")
    )
    args = parser.parse_args()

    text = english_text(args.num_bytes)
    megabytes = len(text.encode("utf-8")) / 1e6
    path = model_gguf("smollm2-135m-instruct")
    ours = load_tokenizer(path)
    reference = smollm2_reference(path)

    cold_s, ids = best_time(
        lambda: ours.encode(text), args.repeats, before=ours.encoder.cache.clear
    )
    warm_s, _ = best_time(lambda: ours.encode(text), args.repeats)
    reference_s, reference_ids = best_time(
        lambda: reference.encode(text, add_special_tokens=False).ids, args.repeats
    )
    if ids != reference_ids:
        raise SystemExit(
            "ids differ from the reference: fix the tokenizer before timing it"
        )

    def rates(seconds):
        return {
            "seconds": round(seconds, 4),
            "mb_per_s": round(megabytes / seconds, 3),
            "tokens_per_s": round(len(ids) / seconds),
        }

    result = {
        "benchmark": "tokenizer_encode",
        "tokenizer": "SmolLM2-135M-Instruct (GGUF)",
        "text_megabytes": round(megabytes, 3),
        "num_tokens": len(ids),
        "repeats": args.repeats,
        "ours_cold": rates(cold_s),
        "ours_warm": rates(warm_s),
        "hf_tokenizers_single_thread": rates(reference_s),
        "ratio_cold": round(reference_s / cold_s, 3),
        "ratio_warm": round(reference_s / warm_s, 3),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    for name in ("ours_cold", "ours_warm", "hf_tokenizers_single_thread"):
        r = result[name]
        print(
            f"{name:28s} {r['mb_per_s']:7.3f} MB/s {r['tokens_per_s']:>10,d} tokens/s"
        )
    print(
        f"ours / tokenizers: {result['ratio_cold']:.2f}x cold cache, {result['ratio_warm']:.2f}x warm cache "
        f"({len(ids):,} tokens, {megabytes:.2f} MB)"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
