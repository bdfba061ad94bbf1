"""Batch-1 decode and 512-token prefill speed: inferpath against transformers.

Both load the same SmolLM2-135M-Instruct GGUF (dequantized to the compute dtype) and run
the same token ids, in the same process, fp32 and bf16:

- prefill: one forward over a 512-token prompt (inferpath: one engine step that
  computes the prompt and samples the first token; transformers: one forward with
  ``use_cache=True`` and the argmax), median of ``--repeats`` runs, as tokens/s;
- decode: one new token per step on top of a short prompt (inferpath: ``engine.step``
  with one running request, greedy; transformers: a forward of one token with its
  ``DynamicCache``, then argmax), median step time over ``--decode-tokens`` steps.

The two run alternately (a prefill each, a decode step each, ...), so that whatever
else the machine is doing slows both alike.

Prints a table with the ratios and writes benchmarks/results/decode.json. No
assertions: the machine is shared and noisy; the ratio measured in one run is the figure.

    python benchmarks/decode.py [--threads 2] [--decode-tokens 64] [--repeats 3]
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
from inferpath.models import resolve_model
from inferpath.sampling.params import SamplingParams

MODEL = "smollm2-135m-instruct"
RESULTS = Path(__file__).parent / "results"
PROMPT_LEN = 512
SHORT_PROMPT = "Write a long story about a lighthouse keeper and the sea."


def long_prompt_ids(engine: LLMEngine, num_tokens: int) -> list[int]:
    text = " ".join(f"Paragraph {i}: the tide rises and the lamp turns over the rocks." for i in range(200))
    ids = engine.tokenizer.encode(text)
    assert len(ids) >= num_tokens, len(ids)
    return ids[:num_tokens]


# ---------------------------------------------------------------------------- inferpath
def inferpath_prefill(engine: LLMEngine, prompt_ids: list[int]) -> float:
    """Seconds for the one step that prefills the whole prompt (prefix caching is off)."""
    engine.add_request("prefill", prompt_ids, SamplingParams(max_tokens=1, temperature=0))
    start = time.perf_counter()
    outputs = engine.step()
    elapsed = time.perf_counter() - start
    assert outputs and outputs[0].finished
    return elapsed


def inferpath_decoder(engine: LLMEngine, prompt_ids: list[int], num_tokens: int):
    """A function that runs one decode step of one greedy request and returns its seconds."""
    params = SamplingParams(max_tokens=num_tokens + 1, temperature=0, ignore_eos=True)
    engine.add_request("decode", prompt_ids, params)
    engine.step()  # prefill

    def step() -> float:
        start = time.perf_counter()
        engine.step()
        return time.perf_counter() - start

    return step


# ---------------------------------------------------------------------------- transformers
def load_transformers(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM  # benchmark-only reference

    path = resolve_model(MODEL)
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()


@torch.inference_mode()
def transformers_prefill(model, prompt_ids: list[int]) -> float:
    ids = torch.tensor([prompt_ids])
    start = time.perf_counter()
    model(ids, use_cache=True).logits[:, -1].argmax(-1).item()
    return time.perf_counter() - start


def transformers_decoder(model, prompt_ids: list[int]):
    """A function that runs one decode step (one token, DynamicCache, argmax); seconds."""
    from transformers import DynamicCache

    with torch.inference_mode():
        state = {"out": model(torch.tensor([prompt_ids]), past_key_values=DynamicCache(), use_cache=True)}

    @torch.inference_mode()
    def step() -> float:
        start = time.perf_counter()
        token = state["out"].logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
        state["out"] = model(token, past_key_values=state["out"].past_key_values, use_cache=True)
        state["out"].logits[:, -1].argmax(-1).item()
        return time.perf_counter() - start

    return step


# ---------------------------------------------------------------------------- main
def measure(dtype_name: str, args: argparse.Namespace) -> dict:
    """Both engines loaded side by side; their runs alternate, so load on the machine
    falls on both alike."""
    dtype = getattr(torch, dtype_name)
    config = EngineConfig(dtype=dtype_name, num_kv_blocks=64, enable_prefix_caching=False,
                          max_num_batched_tokens=PROMPT_LEN)
    engine = LLMEngine.from_model(MODEL, config)
    model = load_transformers(dtype)
    prompt_ids = long_prompt_ids(engine, PROMPT_LEN)
    short_ids = engine.tokenizer.encode(SHORT_PROMPT)

    times = {"ours_prefill": [], "ref_prefill": [], "ours_decode": [], "ref_decode": []}
    inferpath_prefill(engine, short_ids)  # warm-up
    transformers_prefill(model, short_ids)
    for _ in range(args.repeats):
        times["ours_prefill"].append(inferpath_prefill(engine, prompt_ids))
        times["ref_prefill"].append(transformers_prefill(model, prompt_ids))
    ours_step = inferpath_decoder(engine, short_ids, args.decode_tokens)
    ref_step = transformers_decoder(model, short_ids)
    for i in range(args.decode_tokens):
        times["ours_decode"].append(ours_step())
        times["ref_decode"].append(ref_step())

    def rates(prefill: list[float], decode: list[float]) -> dict:
        return {"prefill_tok_per_s": PROMPT_LEN / statistics.median(prefill),
                "decode_tok_per_s": 1.0 / statistics.median(decode),
                "decode_step_ms_median": 1000 * statistics.median(decode),
                "prefill_seconds": prefill, "decode_step_ms": [1000 * t for t in decode]}

    ours = rates(times["ours_prefill"], times["ours_decode"])
    ref = rates(times["ref_prefill"], times["ref_decode"])
    return {"dtype": dtype_name, "inferpath": ours, "transformers": ref,
            "decode_ratio": ours["decode_tok_per_s"] / ref["decode_tok_per_s"],
            "prefill_ratio": ours["prefill_tok_per_s"] / ref["prefill_tok_per_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rows = [measure(dtype, args) for dtype in args.dtypes]
    print(f"{MODEL}, batch 1, {args.threads} threads, prompt {PROMPT_LEN} tokens (prefill), "
          f"{args.decode_tokens} decode steps (median)")
    print(f"{'dtype':<9} {'metric':<14} {'inferpath':>10} {'transformers':>13} {'ratio':>7}")
    for row in rows:
        for metric, key, ratio in (("decode tok/s", "decode_tok_per_s", "decode_ratio"),
                                   ("prefill tok/s", "prefill_tok_per_s", "prefill_ratio")):
            print(f"{row['dtype']:<9} {metric:<14} {row['inferpath'][key]:>10.1f} "
                  f"{row['transformers'][key]:>13.1f} {row[ratio]:>6.2f}x")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "decode.json"
    out.write_text(json.dumps({"model": MODEL, "threads": args.threads, "prompt_len": PROMPT_LEN,
                               "decode_tokens": args.decode_tokens, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
