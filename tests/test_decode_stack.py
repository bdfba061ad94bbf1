"""A decode step's layers in one native call (kernels/decode_stack.py, csrc/quant/decode.c)
against the module-by-module path: the same kernels in the same order, so the same
tokens and the same logprobs to the bit, at every instruction-set level this CPU runs;
and every step or model it cannot run takes the module path."""

from __future__ import annotations

import pytest

from inferpath.config import EngineConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.kernels import build
from inferpath.kernels.decode_stack import CPUDecoderStack
from inferpath.models import resolve_model
from inferpath.sampling.params import SamplingParams

PROMPTS = ["Tell me about the number 7.", "Write a haiku about rain.", "def fibonacci(n):"]


def generate(alias: str, native: bool, calls: list | None = None, threads: int = 2) -> dict:
    """Greedy text and top-5 logprobs of three requests decoding side by side."""
    engine = LLMEngine.from_model(resolve_model(alias), EngineConfig(threads=threads, kv_cache_memory_bytes=64 * 2**20))
    stack = engine.runner.model.model
    assert isinstance(stack, CPUDecoderStack) and stack.native_decode_refusal() == ""
    stack.use_native_decode = native
    if calls is not None:  # count the steps that took the native call
        original = stack._decode_natively

        def counting(*args):
            hidden = original(*args)
            calls.append(hidden is not None)
            return hidden
        stack._decode_natively = counting
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=5)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o.outputs[0] for o in engine.step() if o.finished})
    return {k: (o.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs]) for k, o in done.items()}


@pytest.mark.parametrize("isa", build.LEVEL_NAMES)
def test_native_decode_equals_the_module_path_to_the_bit(isa, monkeypatch):
    """SmolLM2 Q4_1 (Q8_0 embedding and tied head), three rows per decode step."""
    if not build.can_run(isa):
        pytest.skip(f"this CPU cannot execute the {isa} level (its best is {build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", isa)
    if build.native_decode_layers() is None:
        pytest.skip(build.kernel_status())
    calls: list[bool] = []
    native = generate("smollm2-135m-instruct", True, calls)
    assert sum(calls) >= 20 and not calls[0]  # the prefill step took the module path
    assert native == generate("smollm2-135m-instruct", False)


def test_native_decode_with_biases_and_k_quants():
    """Qwen2.5-Coder: Q/K/V biases, Q5_0 / Q8_0 / Q4_K / Q6_K weights."""
    if build.native_decode_layers() is None:
        pytest.skip(build.kernel_status())
    calls: list[bool] = []
    native = generate("qwen2.5-coder-0.5b-instruct", True, calls)
    assert any(calls)
    assert native == generate("qwen2.5-coder-0.5b-instruct", False)


def test_a_wrapped_or_hooked_layer_module_takes_the_module_path():
    """trace's clock wraps module forwards; tensor parallelism hooks o_proj."""
    engine = LLMEngine.from_model(resolve_model("smollm2-135m-instruct"), EngineConfig(threads=1))
    stack = engine.runner.model.model
    plan = stack._native_plan()
    assert not plan.watched()
    mlp = stack.layers[3].mlp
    mlp.forward = mlp.forward  # an instance attribute, as StageClock sets
    assert plan.watched()
    del mlp.forward
    handle = stack.layers[0].self_attn.o_proj.register_forward_hook(lambda *args: None)
    assert plan.watched()
    handle.remove()
    assert not plan.watched()


def test_a_float_model_is_refused_with_a_reason():
    engine = LLMEngine.from_model(resolve_model("smollm2-135m-instruct"),
                                  EngineConfig(threads=1, dtype="float32"))
    assert "quantized" in engine.runner.model.model.native_decode_refusal()


def test_two_engines_decoding_at_once_in_two_threads():
    """ctypes releases the GIL: a second native decode while one runs takes its chunks
    itself instead of sharing the pool's job; both give their tokens as alone."""
    import threading

    if build.native_decode_layers() is None:
        pytest.skip(build.kernel_status())
    alone = generate("smollm2-135m-instruct", True)
    results: list = [None, None]

    def run(i):
        results[i] = generate("smollm2-135m-instruct", True)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results[0] == alone and results[1] == alone
