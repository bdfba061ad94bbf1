"""Where a prefill step (512 tokens, or ``--tokens``) spends its time, stage by stage (the engine's own trace).

One process: loads a GGUF file, warms up, then prefills ``--rounds`` prompts of 512 (``--tokens``) real
tokens (different ones each round, so no prefix-cache hit), each a single step, traced
(engine/trace.py). Prints each stage's median seconds per step and its share, the step's
tok/s, and writes JSON (``--out``). Tracing wraps modules with a clock; its overhead on a
512-token step is small (benchmarks/trace_overhead.py), but the untraced tok/s is also
measured (the round before each traced one) and reported.

    python benchmarks/prefill_profile.py --model PATH.gguf [--threads 2] [--rounds 3] [--tokens 512] [--no-trace]

At 1 thread the tok/s per CPU second (the process's CPU time) is the steadier figure on a
shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import inferpath  # noqa: F401  (before torch: the thread wait policy, threads.py)

TOKENS = 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-trace", action="store_true", help="untraced rounds only")
    parser.add_argument("--tokens", type=int, default=512, help="the prompt, one step (a long one: attention grows)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    global TOKENS
    TOKENS = args.tokens

    from inferpath.config import EngineConfig
    from inferpath.engine.llm_engine import LLMEngine
    from inferpath.engine.trace import trace
    from inferpath.kernels import build
    from inferpath.sampling.params import SamplingParams
    from inferpath.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(Path(args.model))
    ids: list[int] = []
    while len(ids) < TOKENS * (2 * args.rounds + 1):
        ids += tokenizer.encode(json.__doc__ + argparse.__doc__)
    engine = LLMEngine.from_model(args.model, EngineConfig(threads=args.threads, kv_cache_memory_bytes=max(64, TOKENS // 4) * 2**20,
                                                           max_num_batched_tokens=TOKENS))
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)

    cpu_s: list[float] = []  # CPU time per untraced prefill: at 1 thread, what other programs inflate least

    def prefill(rid: str, prompt: list[int]) -> float:
        engine.add_request(rid, prompt, params)
        start, start_cpu = time.perf_counter(), time.process_time()
        while engine.has_unfinished_requests():
            engine.step()
        if rid.startswith("u"):
            cpu_s.append(time.process_time() - start_cpu)
        return time.perf_counter() - start

    prefill("warm", ids[:TOKENS])
    untraced, steps = [], []
    for r in range(args.rounds):
        untraced.append(prefill(f"u{r}", ids[(2 * r + 1) * TOKENS:(2 * r + 2) * TOKENS]))
        if args.no_trace:
            continue
        with trace(engine) as tracer:
            prefill(f"t{r}", ids[(2 * r + 2) * TOKENS:(2 * r + 3) * TOKENS])
        steps += [s for s in tracer.all_steps() if sum(c.num_new_tokens for c in s.chunks) == TOKENS]
    rows = sorted({name for s in steps for name in s.stages})
    medians = {name: statistics.median(s.stages.get(name, 0.0) for s in steps) for name in rows}
    step_s = statistics.median(s.step_s for s in steps) if steps else float("nan")
    result = {"model": args.model, "threads": args.threads, "tokens": TOKENS, "level": build.kernel_level("quantized"),
              "untraced_tok_s": TOKENS / statistics.median(untraced), "cpu_tok_s": TOKENS / statistics.median(cpu_s),
              "traced_step_s": step_s, "stages_s": medians, "untraced_s": untraced, "untraced_cpu_s": cpu_s,
              "traced_steps_s": [s.step_s for s in steps]}
    print(f"level {result['level']}, {args.threads} threads: untraced {result['untraced_tok_s']:.1f} tok/s "
          f"({result['cpu_tok_s']:.1f} per CPU second), traced step {step_s * 1e3:.0f} ms")
    for name, sec in sorted(medians.items(), key=lambda kv: -kv[1]):
        print(f"  {name:14} {sec * 1e3:8.1f} ms  {100 * sec / step_s:5.1f}%")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
