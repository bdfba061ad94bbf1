"""Continuous batching on this CPU: decode throughput and step time vs concurrent sequences.

The seed: "weights are read once per step no matter how many sequences are in flight, so
serving 32 users costs almost the same wall-clock time as serving one." This drives
``LLMEngine`` directly with N = 1, 2, 4, ... 64 requests (greedy, ``ignore_eos``, a fixed
number of new tokens), times the engine steps that compute no prompt tokens (pure
decode), and reports the aggregate decode tokens/s and the step time for each N. Beside
it, transformers' static batched ``generate`` (the same GGUF, left padding, the same
number of new tokens) at 8 and 32, against our engine end to end on the same workload:
in fp32 (the issue's reference) and, when ours runs in another dtype, in that dtype too
(the like-for-like ratio).

Prints a table, writes benchmarks/results/batching.json and batching.png. No assertions:
this machine is shared and noisy; compare the ratios, not the absolute numbers.

    python benchmarks/batching.py [--new-tokens 64] [--threads 2] [--dtype float32] [--repeats 3]
                                  [--skip-transformers]

transformers needs ``accelerate`` to load a GGUF file (``pip install accelerate``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import inferpath  # noqa: F401  (before torch: OMP_WAIT_POLICY=PASSIVE, as every entry point; threads.py)
import torch

from inferpath.config import EngineConfig
from inferpath.engine import LLMEngine
from inferpath.sampling.params import SamplingParams

MODEL = "smollm2-135m-instruct"
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
TRANSFORMERS_BATCH_SIZES = (8, 32)
RESULTS = Path(__file__).parent / "results"
TOPICS = ("rivers", "volcanoes", "bees", "clocks", "bridges", "comets", "deserts", "violins",
          "glaciers", "lighthouses", "owls", "tides")


def make_prompts(num_prompts: int) -> list[str]:
    """Distinct prompts of similar length (no shared prefix beyond the first words)."""
    return [f"Write a short story number {i} about {TOPICS[i % len(TOPICS)]} and the sea."
            for i in range(num_prompts)]


def median_run(runs: list[dict], key: str) -> dict:
    """The run whose ``key`` is the median (the lower middle one for an even count)."""
    return sorted(runs, key=lambda r: r[key])[(len(runs) - 1) // 2]


def run_engine(engine: LLMEngine, prompts: list[str], new_tokens: int, tag: str) -> dict:
    """Run ``prompts`` to completion; time every step, split into decode-only steps."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, params)
    decode_times: list[float] = []
    decode_tokens = 0
    while engine.has_unfinished_requests():
        before = engine.stats()
        t0 = time.perf_counter()
        engine.step()
        elapsed = time.perf_counter() - t0
        after = engine.stats()
        if after.num_prompt_tokens_computed == before.num_prompt_tokens_computed:
            decode_times.append(elapsed)
            decode_tokens += after.num_generation_tokens - before.num_generation_tokens
    total = time.perf_counter() - start
    return {
        "batch_size": len(prompts),
        "decode_steps": len(decode_times),
        "decode_tokens": decode_tokens,
        "decode_seconds": sum(decode_times),
        "step_ms_median": 1000 * statistics.median(decode_times),
        "decode_tok_per_s": decode_tokens / sum(decode_times),
        "end_to_end_seconds": total,
        "end_to_end_tok_per_s": len(prompts) * new_tokens / total,
    }


class TransformersBaseline:
    """transformers' static batched greedy generate on the same GGUF file in ``dtype``,
    left padding, exactly ``new_tokens`` new tokens per sequence (min = max)."""

    def __init__(self, dtype: str = "float32") -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer  # benchmark-only reference

        from inferpath.models import resolve_model

        path = resolve_model(MODEL)
        self.tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.dtype = dtype
        self.model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                          dtype=getattr(torch, dtype)).eval()

    def generate(self, prompts: list[str], new_tokens: int) -> dict:
        batch = self.tokenizer(prompts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            self.model.generate(**batch, max_new_tokens=2, do_sample=False,
                                pad_token_id=self.tokenizer.pad_token_id)  # warm-up
            start = time.perf_counter()
            out = self.model.generate(**batch, max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id)
            elapsed = time.perf_counter() - start
        num_new = (out.shape[1] - batch["input_ids"].shape[1]) * len(prompts)
        return {"seconds": elapsed, "tok_per_s": num_new / elapsed}


def holds_sentence(rows: list[dict]) -> str:
    """Where 'serving 32 users costs almost the same as one' holds on this machine: the
    largest batch up to which every step costs at most 1.5x the batch-1 step."""
    base = rows[0]["step_ms_median"]
    ratios = {r["batch_size"]: r["step_ms_median"] / base for r in rows}
    largest_near = rows[0]["batch_size"]
    for r in rows:
        if ratios[r["batch_size"]] > 1.5:
            break
        largest_near = r["batch_size"]
    text = (f"A decode step at batch 1 takes {base:.1f} ms (median). Up to batch {largest_near} "
            f"every step costs at most 1.5x that, so serving that many users costs almost the "
            f"same wall-clock time as serving one. At batch 32 a step costs "
            f"{ratios.get(32, float('nan')):.2f}x and at 64 {ratios.get(64, float('nan')):.2f}x "
            "the batch-1 step: ")
    if largest_near >= 32:
        return text + "on this CPU the claim holds at 32."
    return text + (f"on this CPU the claim stops beyond batch {largest_near}: from there the "
                   "step is bound by the arithmetic of the growing batch (and attention over "
                   "its context), no longer by reading the weights once.")


def plot(rows: list[dict], hf: dict[str, dict], path: Path, dtype: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["batch_size"] for r in rows]
    fig, (ax_tps, ax_step) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax_tps.plot(sizes, [r["decode_tok_per_s"] for r in rows], "o-", label="inferpath decode")
    ax_tps.plot(sizes, [r["end_to_end_tok_per_s"] for r in rows], "s--", alpha=0.6,
                label="inferpath end to end")
    for (hf_dtype, points), marker in zip(hf.items(), "x+"):
        ax_tps.plot(list(points), [v["tok_per_s"] for v in points.values()], marker, markersize=10,
                    label=f"transformers generate {hf_dtype} (static batch)")
    ax_tps.set(xscale="log", xlabel="concurrent sequences", ylabel="aggregate tokens/s",
               title="Throughput")
    ax_tps.set_xticks(sizes, [str(s) for s in sizes])
    ax_tps.legend(loc="upper left")
    ax_step.plot(sizes, [r["step_ms_median"] for r in rows], "o-")
    ax_step.axhline(rows[0]["step_ms_median"] * 1.5, color="grey", ls=":",
                    label="1.5x batch-1 step")
    ax_step.set(xscale="log", xlabel="concurrent sequences", ylabel="median decode step (ms)",
                title="Step time")
    ax_step.set_xticks(sizes, [str(s) for s in sizes])
    ax_step.legend()
    fig.suptitle(f"{MODEL}, inferpath {dtype} vs transformers {' and '.join(hf) or '(skipped)'}, "
                 f"{torch.get_num_threads()} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="inferpath's dtype (transformers runs in fp32, as in the issue, "
                             "and in this dtype too)")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--repeats", type=int, default=3,
                        help="alternating runs at the batch sizes compared with transformers")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    prompts = make_prompts(max(BATCH_SIZES))

    engine = LLMEngine.from_model(MODEL, EngineConfig(max_num_seqs=max(BATCH_SIZES),
                                                      dtype=args.dtype))
    hf_dtypes = [] if args.skip_transformers else list(dict.fromkeys(["float32", args.dtype]))
    baselines = [TransformersBaseline(d) for d in hf_dtypes]
    run_engine(engine, prompts[:2], 4, "warmup")
    rows, hf = [], {d: {} for d in hf_dtypes}
    for n in BATCH_SIZES:
        compared = n in TRANSFORMERS_BATCH_SIZES and baselines
        # beside transformers: alternate the runs --repeats times and keep the median of each,
        # so that this machine's drifting load falls on both sides alike
        ours, theirs = [], {b.dtype: [] for b in baselines}
        for repeat in range(args.repeats if compared else 1):
            ours.append(run_engine(engine, prompts[:n], args.new_tokens, f"b{n}-{repeat}"))
            print(f"batch {n}: {ours[-1]['step_ms_median']:.1f} ms/step", file=sys.stderr, flush=True)
            if compared:
                for baseline in baselines:
                    theirs[baseline.dtype].append(ref := baseline.generate(prompts[:n], args.new_tokens))
                    print(f"batch {n}: transformers {baseline.dtype} {ref['tok_per_s']:.1f} tok/s",
                          file=sys.stderr, flush=True)
        rows.append(median_run(ours, "end_to_end_tok_per_s"))
        for dtype, runs in theirs.items():
            if runs:
                hf[dtype][n] = median_run(runs, "tok_per_s")

    print(f"{'batch':>5} {'step ms':>8} {'decode tok/s':>13} {'end-to-end tok/s':>17}")
    for r in rows:
        print(f"{r['batch_size']:>5} {r['step_ms_median']:>8.1f} {r['decode_tok_per_s']:>13.1f} "
              f"{r['end_to_end_tok_per_s']:>17.1f}")
    comparison: dict[str, dict] = {}
    for hf_dtype, points in hf.items():
        for n, ref in points.items():
            ours = next(r for r in rows if r["batch_size"] == n)
            entry = {"transformers_tok_per_s": ref["tok_per_s"],
                     "inferpath_end_to_end_tok_per_s": ours["end_to_end_tok_per_s"],
                     "inferpath_decode_tok_per_s": ours["decode_tok_per_s"],
                     "ratio_end_to_end": ours["end_to_end_tok_per_s"] / ref["tok_per_s"],
                     "ratio_decode": ours["decode_tok_per_s"] / ref["tok_per_s"]}
            comparison.setdefault(hf_dtype, {})[n] = entry
            print(f"batch {n}: transformers {hf_dtype} {ref['tok_per_s']:.1f} tok/s; inferpath "
                  f"{args.dtype} {ours['end_to_end_tok_per_s']:.1f} end to end "
                  f"({entry['ratio_end_to_end']:.2f}x), {ours['decode_tok_per_s']:.1f} "
                  f"decode ({entry['ratio_decode']:.2f}x)")
    sentence = holds_sentence(rows)
    print(sentence)
    load = (load_before, os.getloadavg()[0])
    if max(load) > os.cpu_count():
        print(f"NOTE: the machine was busy (1-minute load {load[0]:.1f} -> {load[1]:.1f} on "
              f"{os.cpu_count()} CPUs); the figures are noisy, the ratios less so.")

    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "batching" + ("" if args.threads == 2 else f"_threads{args.threads}") + (
        "" if args.dtype == "float32" else f"_{args.dtype}")
    (RESULTS / f"{stem}.json").write_text(json.dumps({
        "model": MODEL, "dtype": args.dtype, "transformers_dtypes": hf_dtypes,
        "threads": args.threads, "repeats": args.repeats,
        "new_tokens": args.new_tokens, "load_average": load, "rows": rows,
        "transformers": comparison,
        "summary": sentence}, indent=2))
    plot(rows, hf, RESULTS / f"{stem}.png", args.dtype)
    print(f"wrote {RESULTS / stem}.json and .png")


if __name__ == "__main__":
    main()
