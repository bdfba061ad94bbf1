"""A decode step's layers in one native call (kernels/decode_stack.py, csrc/drivers/decode.c)
against the module-by-module path: the same kernels in the same order, so the same
tokens and the same logprobs to the bit, at every instruction-set level this CPU runs,
for quantized GGUF weights and for float32 / bfloat16 ones (a BF16 GGUF read in place
among them); and every step or model it cannot run takes the module path."""

from __future__ import annotations

import pytest
import torch
from gguf_files import write_float_gguf

from inferpath.config import EngineConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.kernels import build
from inferpath.kernels.decode_stack import CPUDecoderStack
from inferpath.models import resolve_model
from inferpath.sampling.params import SamplingParams

PROMPTS = ["Tell me about the number 7.", "Write a haiku about rain.", "def fibonacci(n):"]


def generate(alias: str, native: bool, calls: list | None = None, threads: int = 2, dtype: str = "auto",
             prompts: list[str] = PROMPTS) -> dict:
    """Greedy text and top-5 logprobs of the prompts' requests decoding side by side.
    ``alias``: a packaged model, or a model file's path."""
    path = alias if alias.endswith(".gguf") else resolve_model(alias)
    engine = LLMEngine.from_model(path, EngineConfig(threads=threads, kv_cache_memory_bytes=64 * 2**20, dtype=dtype))
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
    for i, prompt in enumerate(prompts):
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


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("isa", build.LEVEL_NAMES)
def test_native_float_decode_equals_the_module_path_to_the_bit(isa, dtype, monkeypatch):
    """SmolLM2 loaded in bfloat16 / float32 (its blocks dequantized at load): the level's
    GEMV, RMSNorm, RoPE, attention and residual adds rounded where the modules round."""
    if not build.can_run(isa):
        pytest.skip(f"this CPU cannot execute the {isa} level (its best is {build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", isa)
    if build.native_decode_layers(getattr(torch, dtype)) is None:
        pytest.skip(build.kernel_status())
    calls: list[bool] = []
    native = generate("smollm2-135m-instruct", True, calls, dtype=dtype)
    assert sum(calls) >= 20 and not calls[0]
    assert native == generate("smollm2-135m-instruct", False, dtype=dtype)


@pytest.fixture(scope="module")
def bf16_gguf(tmp_path_factory) -> str:
    """The packaged SmolLM2 as a BF16 GGUF (matrices BF16, norms F32: llama.cpp's layout)."""
    path = tmp_path_factory.mktemp("bf16") / "SmolLM2-135M-Instruct.BF16.gguf"
    return str(write_float_gguf(resolve_model("smollm2-135m-instruct"), path))


def test_a_bf16_gguf_decodes_natively_from_the_mapped_file(bf16_gguf):
    """``--dtype auto`` on a BF16 file: bf16 where the CPU multiplies bf16 natively (else
    float32), native decode bitwise equal to the module path."""
    from inferpath.engine.load import auto_float_dtype

    if build.native_decode_layers(auto_float_dtype()) is None:
        pytest.skip(build.kernel_status())
    calls: list[bool] = []
    native = generate(bf16_gguf, True, calls)
    assert sum(calls) >= 20
    assert native == generate(bf16_gguf, False)


def test_a_bf16_gguf_runs_on_the_mapped_tensors_without_a_copy(bf16_gguf):
    """Every parameter of the model the engine builds from a BF16 file is the tensor the
    checkpoint reader returned (a view of the mapped file for matrices): the fused Q/K/V
    and gate/up calls read the separate weights in place, nothing is concatenated."""
    from inferpath.engine.load import build_for_engine
    from inferpath.weights import load_checkpoint

    checkpoint = load_checkpoint(bf16_gguf, dtype=torch.bfloat16)
    pointers = {name: t.data_ptr() for name, t in checkpoint.tensors.items()}
    model = build_for_engine(checkpoint, torch.bfloat16, EngineConfig(threads=1))
    attn = model.model.layers[0].self_attn
    if getattr(attn, "_float_qkv", None) is None:
        pytest.skip(build.kernel_status())
    for name, param in model.named_parameters():
        assert param.data_ptr() == pointers[name], name


def test_a_bf16_batch_of_twelve_decodes_natively_where_the_gemv_serves_it():
    """Without AMX the bf16 GEMV serves up to 32 rows (ops.GEMV_MAX_ROWS_WITHOUT_AMX): twelve
    sequences decode natively, three groups of four rows per weight block, bitwise equal
    to the module path."""
    from inferpath.kernels import ops

    if build.kernel_level(torch.bfloat16) != "avx512" or build.native_amx_gemm(torch.bfloat16) is not None:
        pytest.skip("needs the avx512 bf16 GEMV without AMX (with AMX, 2-128 rows take the AMX GEMM)")
    assert ops.GEMV_MAX_ROWS_WITHOUT_AMX[torch.bfloat16] >= 12
    prompts = [f"Tell me about the number {n}." for n in range(12)]
    calls: list[bool] = []
    native = generate("smollm2-135m-instruct", True, calls, dtype="bfloat16", prompts=prompts)
    assert sum(calls) >= 20
    assert native == generate("smollm2-135m-instruct", False, dtype="bfloat16", prompts=prompts)


def test_a_batch_the_gemv_does_not_serve_takes_the_module_path(monkeypatch):
    """bf16 at the generic level: past its GEMV's four rows the module path runs PyTorch's
    matmul, so the native call (GEMV only) steps aside rather than differ."""
    monkeypatch.setenv("INFERPATH_ISA", "generic")
    if build.native_decode_layers(torch.bfloat16) is None:
        pytest.skip(build.kernel_status())
    engine = LLMEngine.from_model(resolve_model("smollm2-135m-instruct"), EngineConfig(threads=2, dtype="bfloat16"))
    stack = engine.runner.model.model
    steps = []  # (rows, took the native call) of each step
    original = stack._decode_natively

    def recording(input_ids, *args):
        hidden = original(input_ids, *args)
        steps.append((input_ids.shape[0], hidden is not None))
        return hidden
    stack._decode_natively = recording
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    for i in range(5):
        engine.add_request(str(i), f"Count to {i + 3}.", params)
    while engine.has_unfinished_requests():
        engine.step()
    assert [rows for rows, _ in steps[1:]] == [5] * 5  # one prefill step, then five 5-row decodes
    assert not any(native for _, native in steps)


def test_a_model_without_native_kernels_for_its_dtype_is_refused_with_a_reason():
    engine = LLMEngine.from_model(resolve_model("smollm2-135m-instruct"),
                                  EngineConfig(threads=1, dtype="float16"))
    assert "float16" in engine.runner.model.model.native_decode_refusal()


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


# ---------------------------------------------------------------- the allow-list (families.py)

def _tiny_llama_config(config_cls=None, **overrides):
    from inferpath.config import ModelConfig

    fields = dict(architecture="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2,
                  num_heads=2, num_kv_heads=1, head_dim=32, max_position_embeddings=64)
    return (config_cls or ModelConfig)(**(fields | overrides))


def test_every_model_config_field_is_on_the_native_decode_list():
    """The list decides each field of ModelConfig: a field added later is refused until
    someone writes down what the native step does with it (and a stale entry shows here)."""
    from dataclasses import fields

    from inferpath.config import ModelConfig
    from inferpath.families import NATIVE_DECODE_FIELDS

    assert set(NATIVE_DECODE_FIELDS) == {f.name for f in fields(ModelConfig)}


def test_an_unknown_feature_flag_on_a_supported_family_keeps_native_decode_off():
    """A Llama config with one field the list does not know: off, naming the field, both in
    the check and in the decode stack of a model built from it; the same config without the
    field takes the native call."""
    from dataclasses import dataclass

    from inferpath.config import ModelConfig
    from inferpath.families import native_decode_refusal
    from inferpath.kernels import accelerate
    from inferpath.model import Transformer

    @dataclass(frozen=True)
    class FutureConfig(ModelConfig):
        attention_sinks: bool = True  # a feature the native step was never written for

    plain, future = _tiny_llama_config(), _tiny_llama_config(FutureConfig)
    assert native_decode_refusal(plain) == ""
    assert "attention_sinks" in native_decode_refusal(future)
    for config, refused in ((plain, False), (future, True)):
        model = Transformer(config)
        model.init_random_weights()
        accelerate(model)
        reason = model.model.native_decode_refusal()
        if not refused and reason:
            pytest.skip(f"no native decode here: {reason}")
        assert ("attention_sinks" in reason) == refused, reason


@pytest.mark.parametrize("overrides,field", [
    (dict(qk_norm="head"), "qk_norm"), (dict(no_rope_layers=(1,)), "no_rope_layers"),
    (dict(residual_multiplier=0.5), "residual_multiplier"), (dict(post_norms=True), "post_norms"),
    (dict(embedding_multiplier=2.0), "embedding_multiplier"), (dict(hidden_act="gelu"), "hidden_act"),
    (dict(num_experts=4, num_experts_per_tok=2), "num_experts"), (dict(attn_logit_softcapping=5.0), "attn_logit"),
    (dict(architecture="gemma2"), "gemma2"), (dict(architecture="qwen3"), "qwen3"),
    (dict(sliding_window=8, layer_types=("sliding_attention", "full_attention")), "layer_types"),
])
def test_features_and_families_the_native_step_does_not_implement_are_refused(overrides, field):
    from inferpath.families import native_decode_refusal

    assert field in native_decode_refusal(_tiny_llama_config(**overrides))


def test_the_decode_stack_reads_no_private_attribute_of_another_module():
    """decode_stack.py touches the modules it runs through their public accessors only: no
    ``x._name`` on anything but ``self``, no ``_name`` imported. The one exception is
    PyTorch's hook registries, which have no public reader (``watched``)."""
    import ast
    import inspect

    from inferpath.kernels import decode_stack

    torch_hook_registries = {"_forward_hooks", "_forward_pre_hooks", "_global_forward_hooks",
                             "_global_forward_pre_hooks"}
    tree = ast.parse(inspect.getsource(decode_stack))
    private = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                private.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            private += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.startswith("_")]
    private = [p for p in private if p.rsplit(" ", 1)[-1].lstrip(".") not in torch_hook_registries]
    assert private == []
