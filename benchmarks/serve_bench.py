"""Serving benchmark against any OpenAI-compatible server: TTFT, TPOT, ITL, E2E, throughput.

Start a server first (``inferpath serve``, vLLM, llama.cpp's server...), then:

    python benchmarks/serve_bench.py --base-url http://127.0.0.1:8000/v1 --model M \\
        --num-prompts 64 --concurrency 8 --max-tokens 128 [--request-rate 4] [--ignore-eos]

Prints a table (mean, median, p90, p99 in ms) and saves the summary and the config as
JSON (default ``benchmarks/results/serve_bench.json``). No assertions: figures depend on
the machine and its load; compare runs made side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from inferpath.bench.serving import BenchmarkConfig, run_benchmark
from inferpath.bench.serving_metrics import format_summary

RESULTS = Path(__file__).parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True, help="model name the server expects")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at most")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-words", type=int, default=64, help="words per synthetic prompt")
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson req/s (default: all at once)")
    parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--ignore-eos", action="store_true", help="ask for exactly max-tokens (vLLM extension)")
    parser.add_argument("--num-warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--output", type=Path, default=RESULTS / "serve_bench.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = BenchmarkConfig(
            base_url=args.base_url, model=args.model, num_prompts=args.num_prompts,
            concurrency=args.concurrency, max_tokens=args.max_tokens, prompt_words=args.prompt_words,
            request_rate=args.request_rate, endpoint=args.endpoint, temperature=args.temperature,
            ignore_eos=args.ignore_eos, api_key=os.environ.get("OPENAI_API_KEY"),
            timeout_s=args.timeout, num_warmup=args.num_warmup, seed=args.seed,
        )
        summary, _ = asyncio.run(run_benchmark(config))
    except (ValueError, RuntimeError) as exc:
        print(f"serve_bench: {exc}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    saved_config = {k: v for k, v in asdict(config).items() if k != "api_key"}
    saved_config["request_rate"] = str(config.request_rate)  # "inf" is not valid JSON as a number
    record = {"config": saved_config, "summary": summary.to_dict()}
    args.output.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"saved {args.output}")
    return 0 if summary.num_failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
