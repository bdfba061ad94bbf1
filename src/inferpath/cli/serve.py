"""``inferpath serve [MODEL]``: an OpenAI-compatible HTTP server over one model.

Loads the model into an LLMEngine, wraps it in an AsyncEngine and serves the FastAPI app
of ``inferpath.server`` with uvicorn until Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys

from inferpath.config import EngineConfig

DEFAULT_MODEL = "smollm2-135m-instruct"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve MODEL (an alias, a .gguf file or a Hugging Face model folder) "
                    "at /v1/completions, /v1/chat/completions, /v1/models, /tokenize, "
                    "/detokenize, /health and /metrics.")
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                        help=f"model alias or path (default: {DEFAULT_MODEL})")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on the /v1 routes")
    parser.add_argument("--max-n", type=int, default=128, metavar="N",
                        help="the most choices (n) one request may ask for (default: 128, OpenAI's)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model id clients send (default: the alias as typed; "
                             "for a path, the model's own name)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                        help="auto (default): a quantized GGUF runs quantized, float weights bf16 where the CPU has native bf16, else float32")
    parser.add_argument("--tensor-parallel-size", "--tp", type=int, default=1, metavar="N",
                        help="shard the model over N local processes (torch.distributed)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="longest prompt + output in tokens (default: the model's limit)")
    parser.add_argument("--max-num-seqs", type=int, default=64,
                        help="most sequences in one batch (default: 64)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048,
                        help="token budget of one engine step (default: 2048)")
    parser.add_argument("--num-kv-blocks", type=int, default=None,
                        help="KV-cache blocks (default: sized from --kv-cache-memory)")
    parser.add_argument("--kv-cache-memory", type=float, default=2.0,
                        help="KV-cache budget in GiB (default: 2)")
    parser.add_argument("--block-size", type=int, default=16,
                        help="tokens per KV block (default: 16)")
    parser.add_argument("--max-waiting", type=int, default=1024,
                        help="waiting requests before new ones get 429 (default: 1024)")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="disable automatic prefix caching")
    parser.add_argument("--no-cpu-kernels", action="store_true",
                        help="run PyTorch's ops only, not inferpath's native CPU kernels")
    parser.add_argument("--quantization", default=None, choices=("q8_0", "q4_0", "q4_k"),
                        help="quantize float weights on load (a Hugging Face directory or an F32/F16/BF16 GGUF)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="compute threads (default: the physical cores)")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))
    parser.set_defaults(func=run_serve)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the flags describe (validated by EngineConfig itself)."""
    return EngineConfig(
        dtype=args.dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_bytes=int(args.kv_cache_memory * 1024**3),
        enable_prefix_caching=not args.no_prefix_caching,
        max_waiting_requests=args.max_waiting,
        cpu_kernels=not args.no_cpu_kernels,
        quantization=args.quantization,
        threads=args.threads,
    )


def served_name(model_arg: str, engine_model_name: str) -> str:
    """The id clients send: the alias as typed (``smollm2-135m-instruct``); for a path,
    the model's own name."""
    looks_like_path = "/" in model_arg or model_arg.endswith((".gguf", ".safetensors"))
    return engine_model_name if looks_like_path else model_arg


def run_serve(args: argparse.Namespace) -> int:
    from inferpath.engine import AsyncEngine, LLMEngine
    from inferpath.server.app import build_app
    from inferpath.server.launch import serve_forever

    config = engine_config_from_args(args)
    print(f"inferpath serve: loading {args.model} ...", file=sys.stderr)
    engine = LLMEngine.from_model(args.model, config)
    name = args.served_model_name or served_name(args.model, engine.model_name)
    app = build_app(AsyncEngine(engine), api_key=args.api_key, served_model_name=name,
                    max_n=args.max_n)
    print(f"inferpath serve: {name} (max_model_len {engine.max_model_len}) on "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr)
    serve_forever(app, args.host, args.port, log_level=args.log_level)
    return 0
