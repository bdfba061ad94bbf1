"""Where a draft_model speculative step's time goes: the draft's passes and the target's
verification, each by rows and path (the native decode call or the module path).

Wraps ``CPUDecoderStack._decode_natively`` (None back: the module path ran) and the
proposer's ``propose`` and the runner's ``execute`` with clocks, decodes one greedy
request of the code-generation workload, and prints calls, seconds and ms per call.
Not a test; the machine is shared, so read the ratios of one run.

    python benchmarks/speculative_profile.py --model <target> [--draft qwen2.5-coder-0.5b-instruct]
        [--max-tokens 24] [--threads 2]
"""

from __future__ import annotations

import argparse
import collections
import time

from inferpath.config import EngineConfig
from inferpath.engine import LLMEngine
from inferpath.kernels.decode_stack import CPUDecoderStack
from inferpath.sampling.params import SamplingParams

from speculative import WORKLOADS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    spec = {"method": "draft_model", "model": args.draft, "num_speculative_tokens": 4}
    engine = LLMEngine.from_model(args.model, EngineConfig(threads=args.threads, max_model_len=4096,
                                                           speculative_config=spec))
    proposer = engine.speculator.proposer
    draft_stack = proposer.model.model
    for who, stack in (("draft", draft_stack), ("target", engine.runner.model.model)):
        refusal = stack.native_decode_refusal() if isinstance(stack, CPUDecoderStack) else "not native"
        print(f"{who}: {type(stack).__name__}, native decode refused for: {refusal or 'nothing'}")

    calls, seconds = collections.Counter(), collections.defaultdict(float)

    def clocked(key, fn):
        def run(*a, **kw):
            start = time.perf_counter()
            out = fn(*a, **kw)
            calls[key] += 1
            seconds[key] += time.perf_counter() - start
            return out
        return run

    native = CPUDecoderStack._decode_natively

    def decode_natively(stack, input_ids, *rest):
        start = time.perf_counter()
        out = native(stack, input_ids, *rest)
        rows = input_ids.shape[0]
        key = (f"{'draft' if stack is draft_stack else 'target'} {rows if rows <= 8 else '>8'} rows, "
               f"{'native' if out is not None else 'module path'}")
        calls[key] += 1
        seconds[key] += time.perf_counter() - start
        return out

    CPUDecoderStack._decode_natively = decode_natively
    proposer.propose = clocked("propose (the draft, all passes)", proposer.propose)
    engine.runner.execute = clocked("runner.execute (the target)", engine.runner.execute)
    prompt = engine.tokenizer.encode_chat([{"role": "user", "content": WORKLOADS["code_gen"]}])
    engine.add_request("a", prompt, SamplingParams(max_tokens=args.max_tokens, temperature=0))
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.stats()
    print(f"{stats.num_spec_drafts} verifications, {stats.num_spec_accepted_tokens} of "
          f"{stats.num_spec_draft_tokens} drafts accepted (the prompt's steps included below)")
    for key in sorted(calls):
        print(f"  {key:<38} {calls[key]:>4} calls {seconds[key]:7.2f} s "
              f"{1000 * seconds[key] / calls[key]:7.1f} ms/call")


if __name__ == "__main__":
    main()
