"""``inferpath explain``, ``inferpath roofline`` and ``inferpath trace``.

explain: the cost model's stage tables and totals for a model on a hardware spec.
roofline: the same stages placed on a roofline chart (PNG) or as JSON.
trace: a real run of a real model, each stage timed beside the cost model's prediction.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    from inferpath.explain.cost import DTYPE_BYTES
    from inferpath.explain.hardware import hardware_names

    def common(parser: argparse.ArgumentParser, model: str, hardware: str) -> None:
        parser.add_argument("--model", default=model,
                            help="preset name, real-model alias, config.json, model dir or .gguf "
                                 f"(default {model})")
        parser.add_argument("--hardware", default=hardware, metavar="H",
                            help=f"one of {', '.join(hardware_names())} (default {hardware})")
        parser.add_argument("--dtype", default="auto",
                            choices=["auto", *DTYPE_BYTES, "float32", "bfloat16", "float16"],
                            help="weight dtype; auto (default): a GGUF file's own formats, as inferpath "
                                 "runs them (quantized blocks, fp32 activations), else bf16; the engine's "
                                 "spellings float32, bfloat16, float16 are the same as fp32, bf16, fp16")
        parser.add_argument("--json", action="store_true", help="print JSON for programs")

    p = subparsers.add_parser("explain", help="what every stage reads, writes and costs, and its bound")
    common(p, "llama-3-70b", "h100-sxm")
    p.add_argument("--prompt-tokens", type=int, default=7)
    p.add_argument("--output-tokens", type=int, default=184, help="answer length, stop token excluded")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--devices", type=int, default=1, help="shard over N devices (aggregate bandwidth)")
    p.add_argument("--context", type=int, default=None,
                   help="context length of the decode step to tabulate (default prompt + 1)")
    p.add_argument("--no-stop-token", action="store_true",
                   help="the answer ends at max tokens, not with a sampled stop token")
    p.add_argument("--fused-attention", action="store_true",
                   help="model a fused (FlashAttention) kernel: scores never reach memory")
    p.set_defaults(func=_explain)

    r = subparsers.add_parser("roofline", help="draw the roofline chart of prefill and decode stages")
    common(r, "llama-3-70b", "h100-sxm")
    r.add_argument("--out", default="roofline.png", help="PNG to write (default roofline.png)")
    r.add_argument("--context", type=int, default=1024, help="context of the decode steps (default 1024)")
    r.set_defaults(func=_roofline)

    t = subparsers.add_parser("trace", help="serve one request through the engine and time every stage "
                                            "beside the cost model")
    t.add_argument("prompt", nargs="?", default="What is a quadratic equation?")
    t.add_argument("--model", default="smollm2-135m-instruct")
    t.add_argument("--max-tokens", type=int, default=8, help="tokens to generate (default 8)")
    t.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="the engine's dtype (default auto: a quantized GGUF runs quantized, its bytes counted)")
    t.add_argument("--no-cpu-kernels", action="store_true", help="trace PyTorch's kernels instead of the native ones")
    t.add_argument("--show-steps", type=int, default=3, help="sampled steps whose candidates are shown")
    t.add_argument("--no-chat", action="store_true", help="encode the prompt as is, without the chat template")
    t.add_argument("--reprobe", action="store_true", help="measure this machine again instead of reading the cache")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=_trace)
    for parser in (p, r):
        parser.add_argument("--reprobe", action="store_true",
                            help="with --hardware this-machine: measure again instead of reading the cache")


def _precision(dtype: str, model: str):
    """``--dtype``: the weight plan inferpath would run the checkpoint (an alias, a .gguf
    file or a Hugging Face directory) with under it (engine/weight_plan.py); for a model
    with no checkpoint here (a preset), the dtype named, or bf16 for auto."""
    from pathlib import Path

    from inferpath.config import EngineConfig
    from inferpath.engine.weight_plan import plan_weights
    from inferpath.explain.cost import Precision
    from inferpath.explain.presets import REAL_MODEL_ALIASES

    path = Path(model).expanduser()
    if model.lower() in REAL_MODEL_ALIASES and not path.exists():
        from inferpath.models import resolve_model

        path = Path(resolve_model(model))
    engine_dtypes = ("auto", "float32", "bfloat16", "float16")  # EngineConfig's; explain names int8, int4 too
    is_gguf = path.is_file() and path.suffix == ".gguf"
    if dtype in engine_dtypes and (is_gguf or (path / "config.json").is_file()):
        plan = plan_weights(path, EngineConfig(dtype=dtype))
        if not is_gguf:
            return Precision.of_plan(plan)
        from inferpath.explain.gguf_config import gguf_model_config
        from inferpath.explain.stage_formats import formats_of_plan

        # each stage's matrices in their own format (a Q4_K_M file's Q6_K layers at their size)
        return Precision.of_plan(plan).with_formats(formats_of_plan(path, plan, gguf_model_config(path)))
    return Precision("bf16") if dtype == "auto" else Precision.parse(dtype)


def _explain(args: argparse.Namespace) -> int:
    from inferpath.explain.cost import Precision
    from inferpath.explain.hardware import get_hardware
    from inferpath.explain.presets import resolve_model_config
    from inferpath.explain.report import explain_json, explain_text
    from inferpath.explain.request import RequestSpec, estimate_request

    from inferpath.explain.kernel_cost import gemv_shapes
    from inferpath.explain.probe_kernels import with_gemv_shapes

    precision = _precision(args.dtype, args.model)
    # this machine: the call shapes' GEMV rates a trace measured, where cached (nothing measured here)
    hardware = with_gemv_shapes(get_hardware(args.hardware, refresh=args.reprobe), gemv_shapes(precision),
                                measure=False)
    spec = RequestSpec(
        config=resolve_model_config(args.model), hardware=hardware,
        precision=precision, prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens, batch=args.batch, devices=args.devices,
        ends_with_stop=not args.no_stop_token, fused_attention=args.fused_attention,
    )
    cost = estimate_request(spec)
    step = spec.pass_at(1, args.context) if args.context else None
    if args.json:
        print(json.dumps(explain_json(cost, step), indent=2))
    else:
        print(explain_text(cost, step))
    return 0


def _roofline(args: argparse.Namespace) -> int:
    from inferpath.explain.cost import Precision
    from inferpath.explain.hardware import get_hardware
    from inferpath.explain.presets import resolve_model_config
    from inferpath.explain.roofline import plot_roofline, roofline_points

    config, hardware = resolve_model_config(args.model), get_hardware(args.hardware, refresh=args.reprobe)
    precision = _precision(args.dtype, args.model)
    points = roofline_points(config, hardware, precision, decode_context=args.context)
    if args.json:
        print(json.dumps({"model": config.name, "hardware": hardware.name,
                          "memory_bandwidth": hardware.memory_bandwidth,
                          "peak_flops": hardware.flops_for(precision.compute_dtype),
                          "ridge": hardware.ridge_point(precision.compute_dtype),
                          "points": points}, indent=2))
        return 0
    title = (f"{config.name or config.architecture} on {hardware.name}, {precision.description} weights "
             f"(decode at context {args.context})")
    out = plot_roofline(points, hardware, precision.compute_dtype, args.out, title)
    print(f"wrote {out} ({len(points)} points; ridge {hardware.ridge_point(precision.compute_dtype):.3g} FLOP/byte)")
    return 0


def _trace(args: argparse.Namespace) -> int:
    """A thin client of the engine's trace: one request through LLM, then its recorded steps."""
    from inferpath import LLM, SamplingParams
    from inferpath.engine.trace import trace
    from inferpath.explain.trace import machine_for, request_trace
    from inferpath.explain.trace_report import trace_text

    print(f"loading {args.model} ...", file=sys.stderr)
    llm = LLM(args.model, dtype=args.dtype, cpu_kernels=not args.no_cpu_kernels)
    print("probing this machine (cached after the first run) ...", file=sys.stderr)
    hardware = machine_for(llm.engine, refresh=args.reprobe)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    prompt = args.prompt if args.no_chat else llm.tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    with trace(llm.engine) as tracer:
        (output,) = llm.generate(prompt, params)
    result = request_trace(tracer, output.request_id, llm.engine, hardware)
    result["output_text"] = output.outputs[0].text
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    ids = output.prompt_token_ids
    print(trace_text(result, [llm.tokenizer.decode([i]) for i in ids], show_steps=args.show_steps))
    print(f"answer: {output.outputs[0].text!r}")
    return 0
