"""The cost of structured output: 8 JSON-schema requests against 8 free ones, same run.

Drives ``LLMEngine`` directly on SmolLM2-135M: a batch of 8 free requests (greedy,
``ignore_eos``, N new tokens) and a batch of 8 requests constrained by a JSON schema that
keeps them writing for at least N tokens (an object holding a long array of strings),
alternated ``--repeats`` times so the machine's drifting load falls on both alike. For
each batch it times the decode-only steps (all 8 rows decoding, no prompt tokens) and
reads the sampler's grammar timer (filling the 8 bitmasks with llguidance + applying
them to the logits). Target from the issue: constrained steps <= 10% slower.

Prints a table and writes benchmarks/results/structured.json. No assertions: the machine
is shared and noisy; read the same-run ratio.

    python benchmarks/structured.py [--new-tokens 64] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import inferpath  # noqa: F401  (before torch: OMP_WAIT_POLICY=PASSIVE, as every entry point; threads.py)
import torch

from inferpath.config import EngineConfig
from inferpath.engine import LLMEngine
from inferpath.sampling.params import SamplingParams
from inferpath.structured import StructuredOutput

MODEL = "smollm2-135m-instruct"
BATCH = 8
RESULTS = Path(__file__).parent / "results"
SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string"},
                         "notes": {"type": "array", "items": {"type": "string"}, "minItems": 40}},
          "required": ["city", "notes"]}
CITIES = ("Paris", "Tokyo", "Lima", "Cairo", "Oslo", "Delhi", "Rome", "Quito")


def machine() -> str:
    """The CPU model and the instruction sets that matter to the kernels."""
    name, flags = platform.processor() or "cpu", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
    return f"{name} ({', '.join(f for f in wanted if f in flags)})"


def run_batch(engine: LLMEngine, constrained: bool, new_tokens: int) -> dict:
    """Run 8 requests to the end; the decode-only steps' times and the grammar time."""
    timer = engine.runner.sampler.constraint_timer
    grammar_seconds, grammar_steps = timer.seconds, timer.num_steps
    for i, city in enumerate(CITIES[:BATCH]):
        if constrained:
            params = SamplingParams(max_tokens=new_tokens, temperature=0.0,
                                    structured=StructuredOutput.json_schema(SCHEMA))
            prompt = f"Describe {city} as JSON with many notes."
        else:
            params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
            prompt = f"Write about {city} and its many notes."
        engine.add_request(f"{'json' if constrained else 'free'}-{i}-{time.monotonic_ns()}",
                           engine.tokenizer.encode_chat([{"role": "user", "content": prompt}]), params)
    step_times, num_tokens = [], 0
    while engine.has_unfinished_requests():
        running_before = len(engine.scheduler.running)
        start = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - start
        scheduled_prompt = engine.scheduler.stats.num_prompt_tokens_computed
        if running_before == BATCH and all(not o.finished for o in outputs) and len(outputs) == BATCH:
            step_times.append((elapsed, scheduled_prompt))
        num_tokens += sum(len(o.outputs[0].delta_token_ids) for o in outputs)
    # decode-only: steps after which no more prompt tokens were computed
    last_prompt_count = step_times[-1][1] if step_times else 0
    decode = [t for t, prompt_count in step_times if prompt_count == last_prompt_count]
    grammar_steps = timer.num_steps - grammar_steps
    return {"decode_steps": len(decode),
            "step_ms_median": 1e3 * statistics.median(decode),
            "decode_tok_s": BATCH / statistics.median(decode),
            "grammar_ms_per_step": (1e3 * (timer.seconds - grammar_seconds) / grammar_steps
                                    if grammar_steps else 0.0),
            "tokens": num_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = LLMEngine.from_model(MODEL, EngineConfig(max_num_seqs=BATCH))
    run_batch(engine, True, 8)  # warm-up: kernels, the grammar compiler, the schema's cache
    run_batch(engine, False, 8)
    runs = {"free": [], "json_schema": []}
    for _ in range(args.repeats):
        runs["free"].append(run_batch(engine, False, args.new_tokens))
        runs["json_schema"].append(run_batch(engine, True, args.new_tokens))
    summary = {}
    for kind, results in runs.items():
        summary[kind] = {key: statistics.median(r[key] for r in results)
                         for key in ("step_ms_median", "decode_tok_s", "grammar_ms_per_step")}
    ratio = summary["json_schema"]["step_ms_median"] / summary["free"]["step_ms_median"]
    print(f"machine: {machine()}, {args.threads} threads, batch {BATCH}, "
          f"{args.new_tokens} new tokens, median of {args.repeats}")
    print(f"{'batch of 8':<14}{'step ms':>10}{'decode tok/s':>15}{'bitmask ms/step':>18}")
    for kind, figures in summary.items():
        print(f"{kind:<14}{figures['step_ms_median']:>10.2f}{figures['decode_tok_s']:>15.1f}"
              f"{figures['grammar_ms_per_step']:>18.3f}")
    print(f"json_schema step / free step: {ratio:.3f} (target <= 1.10)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "structured.json").write_text(json.dumps({
        "model": MODEL, "machine": machine(), "threads": args.threads, "batch": BATCH,
        "new_tokens": args.new_tokens, "repeats": args.repeats, "summary": summary,
        "step_ratio_json_over_free": ratio, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
