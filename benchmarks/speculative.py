"""Speculative decoding against plain decoding, batch 1, same run, same weights.

Three workloads (chat-templated, greedy, the same prompt for both engines): code editing
(a 60-line function and "rename variable x to count and return the result"),
summarising a given passage, and open chat. For each, the engine without drafts and the
engine with ``--speculative-config`` (default: ngram, k=4, prompt_lookup_max 4) decode
alternately, ``--repeats`` times each, so drifting load falls on both. Figures per
workload: decode tokens/s (output tokens after the first / time after the first),
the mean acceptance length (tokens per verification step: 1 + accepted drafts), tokens
per decode step (output tokens after the first / decode steps), and the ratio
speculative / plain of the median tokens/s. Both engines' outputs are checked equal.

An engine that speculates repacks its K-quant weights by 8 rows where the plain one keeps
the file's layout (avx512: engine/weight_plan.py), and two layouts may break a near tie
differently. Then a third engine decodes in turn, plain on the speculative engine's plan
(``off_same_plan``): the outputs are checked equal against it (greedy identity holds
within one plan), and the ratio against it is reported beside the one against the
default plain engine (``speedup``, the figure a user sees).

llama.cpp on the same GGUF file and the same prompt token ids (llama-cpp-python, greedy,
the same max tokens, ``n_threads`` = ``--threads``): without a draft, and with its prompt
lookup decoding (``llama_cpp.llama_speculative.LlamaPromptLookupDecoding`` as
``draft_model``, ``num_pred_tokens`` = k, ``max_ngram_size`` = ``prompt_lookup_max``
unless ``--llama-pred-tokens`` / ``--llama-ngram`` say otherwise). All four decode in
turn within each repeat. llama.cpp's tokens per step are its output tokens after the
first over its decode ``eval`` calls (one per verification). ``--no-llama`` leaves it out.

Prints a table, writes benchmarks/results/speculative.json. No assertions on time: the
machine is shared, so read the ratios of one run, not absolute figures.

    python benchmarks/speculative.py [--model qwen2.5-coder-0.5b-instruct] [--threads 2]
        [--max-tokens 192] [--repeats 2] [--spec '{"method": "ngram", ...}']
        [--workloads code_edit,summarise,open_chat,code_gen,code_gen_tsv] [--out speculative]
        [--no-llama] [--llama-pred-tokens 4] [--llama-ngram 4] [--warm code_gen]

Suffix decoding keeps earlier requests' outputs (engine/spec/suffix.py): its cache is emptied
before each speculative run, and ``--warm W`` has the engine answer workload W (untimed) first,
so every run sees one earlier, related answer (``--warm code_gen --workloads code_gen_tsv``:
a CSV reader written before a TSV reader is asked for):

    python benchmarks/speculative.py --spec '{"method": "suffix", "num_speculative_tokens": 8}'
        --workloads code_edit,code_gen_tsv,open_chat --warm code_gen --no-llama --out speculative_suffix

A draft model on the 1.5B file (issue 14's), for example:

    python benchmarks/speculative.py --model ~/.cache/inferpath/models/qwen2.5-coder-1.5b-instruct/\
qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --spec '{"method": "draft_model", "model":
        "qwen2.5-coder-0.5b-instruct", "num_speculative_tokens": 4}' --out speculative_draft_model
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from inferpath.config import EngineConfig
from inferpath.engine import LLMEngine
from inferpath.kernels import decode_stack
from inferpath.sampling.params import SamplingParams

RESULTS = Path(__file__).parent / "results"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


def code_function() -> str:
    """A 60-line Python function that uses a variable ``x`` throughout."""
    lines = ["def tally_events(events, threshold):", "    x = 0"]
    kinds = ["click", "view", "scroll", "hover", "submit", "close", "open", "drag", "drop", "resize",
             "focus", "blur", "play", "pause", "seek", "load", "error", "retry", "share"]
    for kind in kinds:
        lines += [f"    if events.get({kind!r}, 0) > threshold:",
                  f"        x += events[{kind!r}]"]
        lines.append(f"        print('{kind}', x)")
    lines.append("    return x")
    assert len(lines) == 60, len(lines)
    return "\n".join(lines)


PASSAGE = (
    "The lighthouse at Cape Verlaine was built in 1871 on a spit of granite that the sea "
    "covered twice a day. Its first keeper, Anna Moreau, kept a log of every ship that passed, "
    "every storm and every repair, and the log survives in the town archive. In the winter of "
    "1893 a storm broke the lantern glass and flooded the lower rooms; Moreau kept the light "
    "burning with a spare lamp for eleven nights until a supply boat could land. The light was "
    "electrified in 1921 and automated in 1968, when the last keeper left. Today the tower is a "
    "museum, and the log is read aloud each year on the anniversary of the storm. Historians "
    "value the log because it records not only ships and weather but also the price of oil, "
    "the wages of the keepers and the names of the fishermen who brought supplies, which makes "
    "it one of the best sources on the daily life of the coast in the late nineteenth century.")

WORKLOADS = {
    "code_edit": code_function() + "\n\nRename variable x to count and return the result. "
                 "Reply with the whole function only.",
    "summarise": PASSAGE + "\n\nSummarise the passage above in three sentences, reusing its wording.",
    "open_chat": "Tell me about your favourite season and why you like it.",
    "code_gen": "Write a Python function that reads a CSV file and returns its rows as a list "
                "of dictionaries, with a docstring and type hints.",
    # a related task: with --warm code_gen, suffix decoding's cache holds the CSV answer
    "code_gen_tsv": "Write a Python function that reads a TSV file and returns its rows as a list "
                    "of dictionaries, with a docstring and type hints.",
}
DEFAULT_WORKLOADS = "code_edit,summarise,open_chat"


def decode_once(engine: LLMEngine, prompt_ids: list[int], max_tokens: int, tag: str) -> dict:
    """One request alone: its tokens, decode tokens/s and tokens per decode step."""
    engine.add_request(tag, prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=0))
    stats0 = engine.stats()
    first_time, num_decode_steps, final = None, 0, None
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        if first_time is not None:
            num_decode_steps += 1
        elif outputs and outputs[0].outputs[0].token_ids:
            first_time = now
        if outputs and outputs[0].finished:
            final, end_time = outputs[0], now
    num_out = len(final.outputs[0].token_ids)
    stats = engine.stats()
    num_drafts = stats.num_spec_drafts - stats0.num_spec_drafts
    num_accepted = stats.num_spec_accepted_tokens - stats0.num_spec_accepted_tokens
    return {
        "token_ids": final.outputs[0].token_ids,
        "num_tokens": num_out,
        "tokens_per_s": (num_out - 1) / (end_time - first_time) if num_out > 1 else None,
        "tokens_per_step": (num_out - 1) / num_decode_steps if num_decode_steps else None,
        "num_verifications": num_drafts,
        "acceptance_length": 1 + num_accepted / num_drafts if num_drafts else None,
        "num_draft_tokens": stats.num_spec_draft_tokens - stats0.num_spec_draft_tokens,
        "num_accepted_tokens": num_accepted,
    }


def warm(engine: LLMEngine, workload: str, max_tokens: int, tag: str) -> None:
    """Empty the drafter's cache of earlier outputs (suffix decoding's), then answer
    ``workload`` untimed, if one is named: each run then sees the same history."""
    clear = getattr(engine.speculator.proposer, "clear_cache", None)
    if clear is not None:
        clear()
    if workload:
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": WORKLOADS[workload]}])
        decode_once(engine, ids, max_tokens, f"warm-{tag}")


def gguf_file(model: str) -> Path | None:
    """The GGUF file behind ``model`` (an alias or a path), or None when it is not one."""
    from inferpath.models import resolve_model

    path = Path(resolve_model(model))
    return path if path.suffix == ".gguf" and path.is_file() else None


class LlamaCpp:
    """llama.cpp (llama-cpp-python) on one GGUF file: without a draft, or with prompt
    lookup decoding; counts its decode ``eval`` calls (one per step)."""

    def __init__(self, path: Path, threads: int, pred_tokens: int | None, ngram: int):
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = (None if pred_tokens is None else
                 LlamaPromptLookupDecoding(max_ngram_size=ngram, num_pred_tokens=pred_tokens))
        # NOTE: with a draft, llama-cpp-python 0.3.36 keeps every row's logits but sizes its
        # score buffer by the logits_all argument: pass it, or prompts past n_batch fail
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=4096, n_threads=threads,
                                   n_threads_batch=threads, draft_model=draft,
                                   logits_all=draft is not None, verbose=False)
        self.num_evals = 0
        evaluate = self.llm.eval

        def counting(tokens):
            self.num_evals += 1
            return evaluate(tokens)

        self.llm.eval = counting

    def decode_once(self, prompt_ids: list[int], max_tokens: int, eos: frozenset) -> dict:
        """Greedy, like ``decode_once``: tokens, decode tokens/s, tokens per decode step."""
        out, first_time, first_evals = [], None, 0
        self.num_evals = 0
        for token in self.llm.generate(prompt_ids, temp=0.0, repeat_penalty=1.0, top_k=1):
            now = time.perf_counter()
            if first_time is None:
                first_time, first_evals = now, self.num_evals
            if token in eos:
                break
            out.append(token)
            end_time = now
            if len(out) >= max_tokens:
                break
        num_steps = self.num_evals - first_evals
        return {"token_ids": out, "num_tokens": len(out),
                "tokens_per_s": (len(out) - 1) / (end_time - first_time) if len(out) > 1 else None,
                "tokens_per_step": (len(out) - 1) / num_steps if num_steps else None}


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--spec", default=json.dumps(NGRAM), help="the speculative config (JSON)")
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS, help=f"of {', '.join(WORKLOADS)}")
    parser.add_argument("--out", default="speculative", help="results/OUT.json, or a path ending in .json")
    parser.add_argument("--module-verify", action="store_true",
                        help="also run the speculative engine with its verification steps on the module path "
                             "(as before the native step took chunks, issue 23 item 0): the same-run 'before'")
    parser.add_argument("--no-llama", action="store_true", help="leave llama.cpp out")
    parser.add_argument("--warm", default="", help="a workload the speculative engine answers (untimed) before "
                        "each of its runs: what a drafter that caches earlier outputs (suffix) has seen; "
                        "without it every run starts from an empty cache")
    parser.add_argument("--llama-pred-tokens", type=int, default=None,
                        help="llama.cpp prompt lookup's num_pred_tokens (default: k)")
    parser.add_argument("--llama-ngram", type=int, default=None,
                        help="llama.cpp prompt lookup's max_ngram_size (default: prompt_lookup_max)")
    args = parser.parse_args()
    spec = json.loads(args.spec)
    path = None if args.no_llama else gguf_file(args.model)
    llamas = {}
    if path is not None:
        pred = args.llama_pred_tokens or spec["num_speculative_tokens"]
        ngram = args.llama_ngram or spec.get("prompt_lookup_max", 4)
        llamas = {"llama_off": LlamaCpp(path, args.threads, None, ngram),
                  "llama_pl": LlamaCpp(path, args.threads, pred, ngram)}
    plain = LLMEngine.from_model(args.model, EngineConfig(threads=args.threads, max_model_len=4096))
    fast = LLMEngine.from_model(args.model, EngineConfig(threads=args.threads, max_model_len=4096,
                                                         speculative_config=spec))
    same_plan = None
    if plain.weight_plan and fast.weight_plan and plain.weight_plan.repacked != fast.weight_plan.repacked:
        import os

        saved = os.environ.get("INFERPATH_REPACK")
        os.environ["INFERPATH_REPACK"] = "1" if fast.weight_plan.repacked else "0"
        same_plan = LLMEngine.from_model(args.model, EngineConfig(threads=args.threads, max_model_len=4096))
        if saved is None:
            del os.environ["INFERPATH_REPACK"]
        else:
            os.environ["INFERPATH_REPACK"] = saved
        assert same_plan.weight_plan.repacked == fast.weight_plan.repacked, same_plan.weight_plan.repacked
    native_chunk_tokens = decode_stack.MAX_CHUNK_TOKENS
    rows = []
    for name in args.workloads.split(","):
        prompt_ids = plain.tokenizer.encode_chat([{"role": "user", "content": WORKLOADS[name]}])
        runs = {"off": [], "spec": []} | ({"spec_module": []} if args.module_verify else {})
        runs |= {"off_same_plan": []} if same_plan is not None else {}
        runs |= {mode: [] for mode in llamas}
        for r in range(args.repeats):
            for mode in runs:
                if mode in llamas:
                    runs[mode].append(llamas[mode].decode_once(prompt_ids, args.max_tokens,
                                                               plain.eos_token_ids))
                    continue
                engine = {"off": plain, "off_same_plan": same_plan}.get(mode, fast)
                if engine is fast:
                    warm(fast, args.warm, args.max_tokens, f"{name}-{mode}-{r}")
                decode_stack.MAX_CHUNK_TOKENS = 0 if mode == "spec_module" else native_chunk_tokens
                runs[mode].append(decode_once(engine, prompt_ids, args.max_tokens, f"{name}-{mode}-{r}"))
            decode_stack.MAX_CHUNK_TOKENS = native_chunk_tokens
        # greedy identity within one weight plan (against off_same_plan where plans differ), repeat
        # by repeat: from the second repeat on the prompt's full blocks are prefix-cache hits, and
        # its tail of 9-16 rows takes r8.c's tiles where a cold prompt's rows took gemm.c's panels
        # (close, not equal: a near tie may flip), for plain and speculative runs alike
        reference = runs["off_same_plan" if same_plan is not None else "off"]
        ours = [(r, run) for m, v in runs.items() if m not in llamas and m != "off" for r, run in enumerate(v)]
        same = all(run["token_ids"] == reference[r]["token_ids"] for r, run in ours)
        same_default = all(run["token_ids"] == runs["off"][r]["token_ids"] for r, run in enumerate(runs["spec"]))
        repeats_agree = all(run["token_ids"] == runs["off"][0]["token_ids"] for run in runs["off"])
        med = {m: statistics.median(x["tokens_per_s"] for x in v) for m, v in runs.items()}
        spec_run = runs["spec"][-1]
        llama_row = {}
        if llamas:
            off_ids = runs["off"][0]["token_ids"]
            llama_row = {
                "llama_off_tokens_per_s": med["llama_off"], "llama_pl_tokens_per_s": med["llama_pl"],
                "speedup_vs_llama_pl": med["spec"] / med["llama_pl"],
                "speedup_vs_llama_off": med["spec"] / med["llama_off"],
                "llama_pl_speedup": med["llama_pl"] / med["llama_off"],
                "llama_pl_tokens_per_step": runs["llama_pl"][-1]["tokens_per_step"],
                # greedy on other kernels: the same tokens up to a near tie
                "llama_same_prefix": {m: common_prefix(off_ids, runs[m][-1]["token_ids"]) for m in llamas},
            }
        rows.append({
            "workload": name, "num_prompt_tokens": len(prompt_ids),
            "num_tokens": spec_run["num_tokens"], "same_tokens": same, "repeats_agree": repeats_agree,
            "off_tokens_per_s": med["off"], "spec_tokens_per_s": med["spec"],
            "speedup": med["spec"] / med["off"], **llama_row,
            "same_tokens_as_default_plan": same_default,
            **({"off_same_plan_tokens_per_s": med["off_same_plan"],
                "speedup_same_plan": med["spec"] / med["off_same_plan"],
                "weight_plans": {"off": list(plain.weight_plan.repacked), "spec": list(fast.weight_plan.repacked)}}
               if same_plan is not None else {}),
            **({"spec_module_tokens_per_s": med["spec_module"], "speedup_module_verify":
                med["spec_module"] / med["off"]} if args.module_verify else {}),
            "acceptance_length": spec_run["acceptance_length"],
            "tokens_per_step": spec_run["tokens_per_step"],
            "num_verifications": spec_run["num_verifications"],
            "runs": {m: [{k: v for k, v in x.items() if k != "token_ids"} for x in v] for m, v in runs.items()},
        })
    print(f"{args.model}, {args.threads} threads, batch 1, greedy, up to {args.max_tokens} tokens, "
          f"speculative_config {json.dumps(spec)}; medians of {args.repeats} (shared machine)")
    print(f"{'workload':<10} {'tokens':>6} {'off tok/s':>9} {'spec tok/s':>10} {'ratio':>6} "
          f"{'accept len':>10} {'tok/step':>8} {'same':>5}")
    for row in rows:
        accept = f"{row['acceptance_length']:.2f}" if row["acceptance_length"] else "-"
        per_step = f"{row['tokens_per_step']:.2f}" if row["tokens_per_step"] else "-"
        print(f"{row['workload']:<10} {row['num_tokens']:>6} {row['off_tokens_per_s']:>9.1f} "
              f"{row['spec_tokens_per_s']:>10.1f} {row['speedup']:>5.2f}x {accept:>10} "
              f"{per_step:>8} {str(row['same_tokens']):>5}")
        if same_plan is not None:
            print(f"{'':<10} plain on the speculative engine's weight plan (repacked): "
                  f"{row['off_same_plan_tokens_per_s']:.1f} tok/s, spec {row['speedup_same_plan']:.2f}x of it; "
                  f"same tokens as the default plain engine: {row['same_tokens_as_default_plan']}")
        if args.module_verify:
            print(f"{'':<10} verification on the module path: {row['spec_module_tokens_per_s']:.1f} tok/s, "
                  f"{row['speedup_module_verify']:.2f}x")
    if llamas:
        print(f"llama.cpp (llama-cpp-python) on {path.name}: off, and prompt lookup "
              f"(num_pred_tokens {pred}, max_ngram_size {ngram}); ratios: inferpath speculative over each")
        print(f"{'workload':<10} {'llama off':>9} {'llama PL':>8} {'PL/off':>6} {'PL tok/step':>11} "
              f"{'spec/PL':>7} {'spec/llama off':>14} {'same prefix off/PL':>18}")
        for row in rows:
            same = row["llama_same_prefix"]
            per_step = row["llama_pl_tokens_per_step"]
            print(f"{row['workload']:<10} {row['llama_off_tokens_per_s']:>9.1f} "
                  f"{row['llama_pl_tokens_per_s']:>8.1f} {row['llama_pl_speedup']:>5.2f}x "
                  f"{(f'{per_step:.2f}' if per_step else '-'):>11} {row['speedup_vs_llama_pl']:>6.2f}x "
                  f"{row['speedup_vs_llama_off']:>13.2f}x "
                  f"{same['llama_off']:>8}/{same['llama_pl']}")
    RESULTS.mkdir(exist_ok=True)
    # a name (results/NAME.json) or a path ending in .json
    out = Path(args.out) if args.out.endswith(".json") else RESULTS / f"{args.out}.json"
    out.write_text(json.dumps({"model": args.model, "threads": args.threads, "batch": 1, "warm": args.warm or None,
                               "max_tokens": args.max_tokens, "repeats": args.repeats,
                               "speculative_config": spec, "note": "shared, noisy machine",
                               "llama_cpp": None if not llamas else {
                                   "file": str(path), "num_pred_tokens": pred, "max_ngram_size": ngram},
                               "workloads": rows}, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
