"""A verification step against a decode step: k + 1 rows of one sequence in one step.

A speculative verification computes the sequence's last token and its k drafts in one
step: k + 1 rows over the same weight bytes. For each model, one sequence with a context of
``--context`` tokens (prefilled once), then, alternately, ``--repeats`` times each: steps
of 1, 2, 3, 5 and 8 tokens at the context's end (the same slots rewritten each time), laid
out as the engine's runner lays out a verification (``--layout rows``: one-token rows of the
sequence, each row's attention a decode's; ``--layout chunk``: one prompt chunk), timed
from the model's forward to the LM head's logits for every row (a verification needs them
all), once through the native decode call and once through the module path
(``use_native_decode = False``). The figure: median milliseconds a step, and each step's
ratio to the median one-token native step of the same run (the target: at most 1.3x for
5 rows). Which path a step took is checked, not assumed: a native figure whose step left
the native call is an error. ``--module-only`` times the module path alone, against its own
one-token step: where the native call takes no multi-row chunk (below avx512 it has no
prefill attention, so a verification of one sequence takes the module path, whose linear
layers run the same quantized kernels).

Prints a table, writes benchmarks/results/verify_step.json. No assertions on time: the
machine may be shared, so read the ratios of one run.

    python benchmarks/verify_step.py [--models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct,PATH.gguf]
        [--threads 1] [--context 64] [--repeats 15] [--rows 1,2,3,5,8] [--module-only] [--layout rows|chunk]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import inferpath  # noqa: F401  (before torch: OMP_WAIT_POLICY=PASSIVE, as every entry point; threads.py)
import torch

from inferpath.config import EngineConfig
from inferpath.engine import LLMEngine
from inferpath.model.metadata import one_sequence_metadata, verification_metadata
from inferpath.models import resolve_model

RESULTS = Path(__file__).parent / "results"
Q4_K_M_1_5B = Path.home() / ".cache/inferpath/models/qwen2.5-coder-1.5b-instruct/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DEFAULT_MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", str(Q4_K_M_1_5B)]


def measure(model_name: str, threads: int, context: int, rows: list[int], repeats: int,
            module_only: bool = False, layout: str = "rows") -> dict:
    path = model_name if model_name.endswith(".gguf") else resolve_model(model_name)
    engine = LLMEngine.from_model(path, EngineConfig(threads=threads))
    torch.set_num_threads(threads)
    model, kv_cache = engine.runner.model, engine.runner.kv_cache
    stack = model.model
    refusal = stack.native_decode_refusal()
    if refusal:
        raise SystemExit(f"{model_name}: the native decode call does not run this model ({refusal})")
    block_size = kv_cache.k_caches[0].shape[1]
    num_blocks = -(-(context + max(rows)) // block_size)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        prompt = torch.randint(0, vocab, (context,), generator=generator)
        model(prompt, torch.arange(context), kv_cache, one_sequence_metadata(0, context, num_blocks, block_size))

    took_native: list[bool] = []
    original = stack._decode_natively

    def watching(*args):
        hidden = original(*args)
        took_native.append(hidden is not None)
        return hidden
    stack._decode_natively = watching

    def step(m: int, native: bool) -> float:
        stack.use_native_decode = native
        ids = torch.randint(0, vocab, (m,), generator=generator)
        layout_of = verification_metadata if layout == "rows" else one_sequence_metadata
        meta = layout_of(context, m, num_blocks, block_size)
        took_native.clear()
        start = time.perf_counter()
        with torch.inference_mode():
            hidden = model(ids, torch.arange(context, context + m), kv_cache, meta)  # (m, hidden)
            model.compute_logits(hidden)  # (m, vocab): every row of a verification is scored
        seconds = time.perf_counter() - start
        if native and took_native != [True]:
            raise SystemExit(f"{model_name}: a {m}-row step left the native decode call: the native figure "
                             "would time the module path")
        return seconds

    paths = (False,) if module_only else (True, False)
    for m in rows:  # warm up the paths at every row count
        for native in paths:
            step(m, native)
    times: dict[tuple[int, bool], list[float]] = {(m, n): [] for m in rows for n in paths}
    for _ in range(repeats):
        for m in rows:
            for native in paths:
                times[(m, native)].append(step(m, native))
    stack.use_native_decode = True
    one = statistics.median(times[(1, paths[0])])  # the native one-token step, or the module path's
    table = []
    for m in rows:
        module_ms = 1e3 * statistics.median(times[(m, False)])
        native_ms = None if module_only else 1e3 * statistics.median(times[(m, True)])
        table.append({"rows": m, "native_ms": None if native_ms is None else round(native_ms, 2),
                      "module_ms": round(module_ms, 2),
                      "native_vs_one_token": None if native_ms is None else round(native_ms / (1e3 * one), 3),
                      "module_vs_one_token": round(module_ms / (1e3 * one), 3)})
    return {"model": Path(model_name).name, "threads": threads, "context": context, "repeats": repeats, "layout": layout,
            "activations": str(model.dtype).removeprefix("torch."),
            "steps": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rows", default="1,2,3,5,8")
    parser.add_argument("--out", default="verify_step", help="results/OUT.json, or a path ending in .json")
    parser.add_argument("--module-only", action="store_true", help="time the module path alone")
    parser.add_argument("--layout", choices=("rows", "chunk"), default="rows",
                        help="rows: one-token rows of the sequence, as the runner lays out a verification "
                             "(each row's attention a decode's); chunk: one prompt chunk of m tokens")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if rows[0] != 1:
        raise SystemExit(f"--rows must start with 1 (the one-token step the others are compared with), got {rows}")
    results = []
    for name in args.models.split(","):
        if name.endswith(".gguf") and not Path(name).exists():
            print(f"skipped {name}: no such file")
            continue
        result = measure(name, args.threads, args.context, rows, args.repeats, args.module_only, args.layout)
        results.append(result)
        print(f"\n{result['model']}  ({args.threads} thread(s), context {args.context}, median of {args.repeats})")
        print(f"{'rows':>4} {'native ms':>10} {'x 1-token':>10} {'module ms':>10} {'x 1-token':>10}")
        for s in result["steps"]:
            native = "-" if s["native_ms"] is None else f"{s['native_ms']:.2f}"
            native_x = "-" if s["native_ms"] is None else f"{s['native_vs_one_token']:.2f}x"
            print(f"{s['rows']:>4} {native:>10} {native_x:>10} {s['module_ms']:>10.2f} {s['module_vs_one_token']:>9.2f}x")
    RESULTS.mkdir(exist_ok=True)
    # a name (results/NAME.json) or a path ending in .json
    out = Path(args.out) if args.out.endswith(".json") else RESULTS / f"{args.out}.json"
    out.write_text(json.dumps({"threads": args.threads, "context": args.context, "results": results}, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
