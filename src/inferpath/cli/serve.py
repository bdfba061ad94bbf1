"""``inferpath serve [MODEL]``: an OpenAI-compatible HTTP server over one model.

Loads the model into an LLMEngine, wraps it in an AsyncEngine and serves the FastAPI app
of ``inferpath.server`` with uvicorn until Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys

from inferpath.cli.engine_flags import add_engine_flags, engine_config_from_args
from inferpath.deploy.cli import add_replica_flags, run_replicas, wants_replicas
from inferpath.server.generation_defaults import CHOICES as GENERATION_CHOICES, parse_override, read_generation_defaults
from inferpath.server.reasoning import REASONING_PARSERS
from inferpath.server.response_store import DEFAULT_MAX_BYTES, DEFAULT_MAX_RESPONSES

DEFAULT_MODEL = "smollm2-135m-instruct"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve MODEL (an alias, a .gguf file or a Hugging Face model folder) "
                    "at /v1/completions, /v1/chat/completions, /v1/models, /tokenize, "
                    "/detokenize, /health and /metrics.")
    parser.add_argument("model", nargs="?", default=None,
                        help="model: an alias, its Hugging Face id, another Hugging Face id "
                             f"(from its cache), a .gguf file or a folder (default: {DEFAULT_MODEL})")
    parser.add_argument("--model", dest="model_option", default=None, metavar="MODEL",
                        help="the same as the positional MODEL (vLLM's spelling)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on the /v1 routes")
    parser.add_argument("--max-n", type=int, default=128, metavar="N",
                        help="the most choices (n) one request may ask for (default: 128, OpenAI's)")
    parser.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="the model ids clients may send, the first one reported (default: "
                             "the Hugging Face id of an alias or id, and the alias; a .gguf "
                             "file's stem; a folder's name)")
    parser.add_argument("--trace", choices=("on", "off"), default=None,
                        help="whether a request may turn the engine's trace on with the header "
                             "'X-Inferpath-Trace: 1' (the page at / does): default on when bound to a "
                             "loopback address (127.0.0.1, localhost, ::1), off otherwise; off, such a "
                             "request is answered untraced with 'X-Inferpath-Trace: off' and "
                             "/v1/trace/{id} is a 403")
    parser.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                        help="enable CORS for these browser origins ('*' for any; default: off)")
    parser.add_argument("--reasoning-parser", default=None, choices=REASONING_PARSERS,
                        help="how answers' reasoning is split from their content (vLLM's "
                             "names; default: chosen from the model and its chat template)")
    parser.add_argument("--responses-store-max", type=_at_least_one, default=DEFAULT_MAX_RESPONSES,
                        metavar="N", help="the most stored Responses (store: true) kept for "
                        f"previous_response_id and GET; the oldest evicted (default: {DEFAULT_MAX_RESPONSES})")
    parser.add_argument("--responses-store-bytes", type=_at_least_one, default=DEFAULT_MAX_BYTES,
                        metavar="BYTES", help="the most bytes of stored Responses' JSON kept "
                        f"(default: {DEFAULT_MAX_BYTES} = {DEFAULT_MAX_BYTES >> 20} MiB)")
    parser.add_argument("--generation-config", choices=GENERATION_CHOICES, default="auto",
                        help="sampling defaults for fields a request leaves out: 'auto' takes the "
                             "model directory's generation_config.json (temperature, top_p, top_k, "
                             "min_p, repetition_penalty; a GGUF file has none), 'none' keeps OpenAI's")
    parser.add_argument("--override-generation-config", default=None, metavar="JSON",
                        help="sampling defaults on top of --generation-config, e.g. "
                             "'{\"temperature\": 0.7, \"top_p\": 0.8, \"top_k\": 20}'")
    add_engine_flags(parser)
    add_replica_flags(parser)
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))
    parser.set_defaults(func=run_serve)


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def response_store_from_args(args: argparse.Namespace):
    from inferpath.server.response_store import ResponseStore

    return ResponseStore(max_responses=args.responses_store_max, max_bytes=args.responses_store_bytes)


def model_argument(args: argparse.Namespace) -> str:
    """MODEL from the positional or --model (one of them, or both the same)."""
    if args.model and args.model_option and args.model != args.model_option:
        raise SystemExit(f"inferpath serve: two models given: {args.model!r} and "
                         f"--model {args.model_option!r}")
    return args.model or args.model_option or DEFAULT_MODEL


def tracing_allowed(trace: str | None, host: str) -> bool:
    """``--trace``: as asked, else on only for a loopback address (a client elsewhere could
    otherwise slow every request sharing its steps, and read its batch's sizes)."""
    if trace is not None:
        return trace == "on"
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: not known to be this machine only
        return False


OPENAI_DEFAULTS = "OpenAI's (temperature 1, top_p 1)"


def sampling_defaults_from_args(args: argparse.Namespace, model: str) -> dict:
    """--generation-config's defaults from ``model``, --override-generation-config on top."""
    return {**read_generation_defaults(model, args.generation_config),
            **parse_override(args.override_generation_config)}


def run_serve(args: argparse.Namespace) -> int:
    from inferpath.engine import AsyncEngine, LLMEngine
    from inferpath.models import served_model_names
    from inferpath.server.app import build_app
    from inferpath.server.launch import bind_socket, serve_forever

    from inferpath.parallel.launch import launched_by_torchrun, launched_rank

    model = model_argument(args)
    config = engine_config_from_args(args)
    try:
        args.sampling_defaults = sampling_defaults_from_args(args, model)
    except ValueError as exc:
        print(f"inferpath serve: {exc}", file=sys.stderr)
        return 1
    if wants_replicas(args):
        return run_replicas(args, model, config)
    if launched_by_torchrun() and launched_rank()[0] != 0:  # torchrun across hosts: rank 0 serves
        from inferpath.parallel.tp_model import run_launched_worker

        run_launched_worker(config.threads)
        return 0
    try:
        sock = bind_socket(args.host, args.port)  # before the minutes of loading
    except OSError as exc:
        print(f"inferpath serve: {exc}", file=sys.stderr)
        return 1
    print(f"inferpath serve: loading {model} ...", file=sys.stderr)
    engine = LLMEngine.from_model(model, config)
    names = args.served_model_name or served_model_names(model)
    name = names[0]
    tracing = tracing_allowed(args.trace, args.host)
    app = build_app(AsyncEngine(engine), api_key=args.api_key, served_model_name=names,
                    max_n=args.max_n, allowed_origins=args.allowed_origins, tracing=tracing,
                    reasoning_parser=args.reasoning_parser, sampling_defaults=args.sampling_defaults,
                    response_store=response_store_from_args(args))
    print(f"inferpath serve: {name} (max_model_len {engine.max_model_len}) on "
          f"http://{args.host}:{args.port}/v1; tracing {'on' if tracing else 'off'}"
          f"{'' if args.trace else ' (the default for this address; --trace on|off)'}; sampling defaults "
          f"{args.sampling_defaults or OPENAI_DEFAULTS}", file=sys.stderr)
    serve_forever(app, sock, log_level=args.log_level)
    return 0
