"""``inferpath generate PROMPT`` and ``inferpath chat``: stream a model's answer.

The answer goes to stdout as it is produced; one summary line goes to stderr at the end:
prompt tokens, time to first token, decode speed, and the KV-cache bytes the request
holds (seed formula: 2 x layers x kv_heads x head_dim x dtype bytes per token).
"""

from __future__ import annotations

import argparse
import sys

from inferpath.cli.engine_flags import add_engine_flags, engine_config_from_args
from inferpath.threads import threads_phrase

DEFAULT_MODEL = "smollm2-135m-instruct"


def register(subparsers: argparse._SubParsersAction) -> None:
    gen = subparsers.add_parser("generate", help="stream a model's answer to one prompt",
                                description="Stream a model's answer to one prompt.")
    gen.add_argument("prompt", help="the prompt (the chat template is applied unless --no-chat)")
    _add_common(gen)
    gen.add_argument("--no-chat", action="store_true",
                     help="send the prompt as plain text, without the chat template")
    gen.set_defaults(func=run_generate)

    chat = subparsers.add_parser("chat", help="talk to a model interactively",
                                 description="Interactive chat; /reset clears the "
                                             "conversation, /exit (or Ctrl-D) quits.")
    _add_common(chat)
    chat.set_defaults(func=run_chat)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"alias, .gguf file or model directory (default {DEFAULT_MODEL})")
    parser.add_argument("--system", default=None, help="a system message to start with")
    add_engine_flags(parser)
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--max-tokens", type=int, default=256)
    sampling.add_argument("--temperature", type=float, default=0.0,
                          help="0 = greedy (default)")
    sampling.add_argument("--top-p", type=float, default=1.0)
    sampling.add_argument("--top-k", type=int, default=0)
    sampling.add_argument("--min-p", type=float, default=0.0)
    sampling.add_argument("--repetition-penalty", type=float, default=1.0)
    sampling.add_argument("--presence-penalty", type=float, default=0.0)
    sampling.add_argument("--frequency-penalty", type=float, default=0.0)
    sampling.add_argument("--seed", type=int, default=None)
    sampling.add_argument("--stop", action="append", default=None,
                          help="a stop string (repeat for several)")
    sampling.add_argument("--ignore-eos", action="store_true")


def _sampling_params(args: argparse.Namespace):
    from inferpath.sampling.params import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos)


def _load_engine(args: argparse.Namespace):
    from inferpath.engine.llm_engine import LLMEngine

    config = engine_config_from_args(args)
    print(f"loading {args.model} ...", file=sys.stderr, flush=True)
    return LLMEngine.from_model(args.model, config, progress=True)


def _stream_answer(engine, request_id: str, prompt, params) -> str:
    """Print the answer as it comes, then the summary line; returns the answer text."""
    engine.add_request(request_id, prompt, params)
    final = None
    try:
        while final is None:
            for output in engine.step():
                if output.request_id != request_id:
                    continue
                sys.stdout.write(output.outputs[0].delta_text)
                sys.stdout.flush()
                if output.finished:
                    final = output
    except KeyboardInterrupt:
        engine.abort_request(request_id)
        engine.step()
        raise
    sys.stdout.write("\n")
    sys.stdout.flush()
    import torch

    tuner = engine.runner.thread_tuner
    threads = tuner.describe() if tuner else threads_phrase(torch.get_num_threads())
    stack = engine.runner.model.model
    if hasattr(stack, "native_decode_refusal"):  # kernels/decode_stack.py
        refusal = stack.native_decode_refusal()
        threads += ", native decode" if not refusal else f", module decode ({refusal})"
    bandwidth = _read_bandwidth()
    stats = engine.stats()
    speculative = (stats.mean_acceptance_length, stats.num_spec_drafts) if engine.speculator else None
    print(summary_line(final, engine.kv_cache.bytes_per_token, engine.weight_format, bandwidth,
                       threads=threads, plan=engine.weight_plan, speculative=speculative),
          file=sys.stderr, flush=True)
    if not speculative:  # with drafts a step reads the weights once for several tokens
        _check_probe(final, engine.weight_format, bandwidth)
    return final.outputs[0].text


def _read_bandwidth() -> float | None:
    """This machine's measured read bandwidth (explain's probe, cached after the first run)."""
    try:
        from inferpath.explain.probe import probe_this_machine

        return probe_this_machine().memory_bandwidth
    except (OSError, RuntimeError, ValueError):
        return None


def summary_line(output, kv_bytes_per_token: int, weights=None, bandwidth: float | None = None,
                 threads: str | None = None, plan=None,
                 speculative: tuple[float | None, int] | None = None) -> str:
    """prompt tokens | TTFT | decode tok/s | what ran (the weight ``plan``'s line where given,
    engine/weight_plan.py: weight formats and how they run, activation and KV dtypes,
    kernel level; else ``weights``' formats; threads: ``threads`` or PyTorch's count) |
    weight bytes a decode step reads, and
    the decode speed as a fraction of the bandwidth floor (bytes per token / read
    bandwidth) | speculative decoding: the mean acceptance length (tokens per verification
    step) and the number of verifications, given as ``speculative`` | KV bytes held | finish.

    NOTE: with speculation a step reads the weights once for several tokens, so tokens/s
    x bytes per token is no read rate: the floor comparison is left out."""
    completion = output.outputs[0]
    metrics = output.metrics
    num_prompt, num_out = len(output.prompt_token_ids), len(completion.token_ids)
    ttft = metrics.time_to_first_token
    ttft_text = f"{ttft * 1000:.0f} ms" if ttft is not None else "n/a"
    decode_s = (metrics.finished_time - metrics.first_token_time) if ttft is not None else 0.0
    tok_s = (num_out - 1) / decode_s if num_out > 1 and decode_s > 0 else None
    rate = f"{tok_s:.1f} tok/s" if tok_s else "n/a"
    num_tokens = num_prompt + num_out
    kv_bytes = num_tokens * kv_bytes_per_token
    ran = ""
    if weights is not None:
        import torch

        threads = threads or threads_phrase(torch.get_num_threads())
        what = plan.describe() if plan is not None else weights.describe()
        ran = f"{what}, {threads} | {weights.decode_bytes / 1e6:.1f} MB/token"
        if bandwidth and tok_s and not speculative:
            ran += floor_text(tok_s * weights.decode_bytes, bandwidth)
        ran += " | "
    if speculative:
        length, num_drafts = speculative
        ran += (f"speculative: acceptance length {length:.2f} over {num_drafts} verifications | "
                if length else "speculative: no drafts verified | ")
    return (f"[prompt {num_prompt} tokens | TTFT {ttft_text} | decode {rate} ({num_out} tokens) | {ran}"
            f"KV {kv_bytes / 1e6:.2f} MB ({num_tokens} tokens x {kv_bytes_per_token:,} B) | "
            f"finish {completion.finish_reason}]")


def floor_text(read_rate: float, bandwidth: float) -> str:
    """The decode speed against the bandwidth floor; never above 100%: a step that read faster
    than the probe allows proves the probe stale (explain/probe_guard.py)."""
    if read_rate > bandwidth:
        return (f", read {read_rate / 1e9:.1f} GB/s: above the probed {bandwidth / 1e9:.1f} GB/s floor "
                "(probe stale: measured again next run)")
    return f", {read_rate / bandwidth:.0%} of the {bandwidth / 1e9:.1f} GB/s floor"


def _check_probe(output, weights, bandwidth: float | None) -> None:
    """Tell the probe what this decode attained, so a stale floor is measured again."""
    metrics, num_out = output.metrics, len(output.outputs[0].token_ids)
    if not bandwidth or weights is None or metrics.time_to_first_token is None or num_out < 2:
        return
    decode_s = metrics.finished_time - metrics.first_token_time
    if decode_s > 0 and (num_out - 1) / decode_s * weights.decode_bytes > bandwidth:
        from inferpath.explain.probe import note_observed

        note_observed((num_out - 1) / decode_s * weights.decode_bytes)


def run_generate(args: argparse.Namespace) -> int:
    params = _sampling_params(args)
    engine = _load_engine(args)
    prompt = args.prompt
    if not args.no_chat and engine.tokenizer.chat_template:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        prompt = engine.tokenizer.encode_chat(messages + [{"role": "user", "content": args.prompt}])
    _stream_answer(engine, "generate", prompt, params)
    return 0


def run_chat(args: argparse.Namespace) -> int:
    params = _sampling_params(args)
    engine = _load_engine(args)
    if not engine.tokenizer.chat_template:
        print(f"inferpath chat: error: {args.model} has no chat template; use "
              "`inferpath generate --no-chat`", file=sys.stderr)
        return 1
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    print("chat with the model; /reset clears the conversation, /exit quits", file=sys.stderr)
    for turn in range(10**9):
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            messages = list(start)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        answer = _stream_answer(engine, f"chat-{turn}", engine.tokenizer.encode_chat(messages), params)
        messages.append({"role": "assistant", "content": answer})
    return 0
