"""A decode step's layers in one native call (kernels/decode_stack.py, csrc/drivers/decode.c)
against the module-by-module path: the same kernels in the same order, so the same
tokens and the same logprobs to the bit, at every instruction-set level this CPU runs,
for quantized GGUF weights and for float32 / bfloat16 ones (a BF16 GGUF read in place
among them); and every step or model it cannot run takes the module path."""

from __future__ import annotations

import ctypes

import pytest
import torch
from gguf_files import write_float_gguf

from inferpath.config import EngineConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.kernels import build
from inferpath.kernels.decode_stack import NATIVE_TIMED, CPUDecoderStack
from inferpath.kernels.repacked import REPACK_LEVELS
from inferpath.models import resolve_model
from inferpath.sampling.params import SamplingParams

PROMPTS = ["Tell me about the number 7.", "Write a haiku about rain.", "def fibonacci(n):"]


def generate(alias: str, native: bool, calls: list | None = None, threads: int = 2, dtype: str = "auto",
             prompts: list[str] = PROMPTS, chunk_calls: list | None = None, served: list | None = None,
             **config) -> dict:
    """Greedy text and top-5 logprobs of the prompts' requests decoding side by side.
    ``alias``: a packaged model, or a model file's path. ``chunk_calls``: per step with a
    step of more than one row of some sequence (a prompt chunk, or a verification: laid out
    as one-token rows by the runner), whether it took the call. ``served``: per step (with
    ``calls``), whether the level's matrix kernels the call runs serve its rows (the native
    plan's ``serves``: the module path's kernel for that many rows is the call's)."""
    path = alias if alias.endswith(".gguf") else resolve_model(alias)
    engine = LLMEngine.from_model(path, EngineConfig(threads=threads, kv_cache_memory_bytes=64 * 2**20, dtype=dtype,
                                                     **config))
    stack = engine.runner.model.model
    assert isinstance(stack, CPUDecoderStack) and stack.native_decode_refusal() == ""
    stack.use_native_decode = native
    if calls is not None or chunk_calls is not None:  # count the steps that took the native call
        original = stack._decode_natively

        def counting(*args):
            hidden = original(*args)
            if calls is not None:
                calls.append(hidden is not None)
            if served is not None:
                served.append(stack._native_plan().serves(args[0].shape[0]))
            if chunk_calls is not None and args[0].shape[0] > len(engine.scheduler.running):
                chunk_calls.append(hidden is not None)
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
    assert sum(calls) >= 20
    # the prompts' step (three chunks of 7-9 tokens) is native where the module path's
    # prefill attention is (avx2, avxvnni, avx512), else it takes the module path
    assert calls[0] == (build.native_prefill_attention(torch.float32) is not None)
    assert native == generate("smollm2-135m-instruct", False)


def test_a_step_of_many_rows_splits_its_row_kernels_over_the_pool_to_the_same_bits():
    """Five prompts of 25-32 tokens make a first step of 140+ rows: SmolLM2's RMSNorm (576
    values a row), RoPE (960) and SwiGLU gate (1536) pass drivers/decode.c's 65536 values
    and run row by row on the decode pool (never the kernels' OpenMP regions): every
    token and logprob is the module path's."""
    if build.native_decode_layers() is None or build.native_prefill_attention(torch.float32) is None:
        pytest.skip(f"chunks are native where the prefill attention kernel is: {build.kernel_status()}")
    prompts = [f"Story {i}: once upon a time there was a small robot who liked to count the stars, "
               f"the clouds and the birds over the old town." for i in range(5)]
    calls: list[bool] = []
    served: list[bool] = []
    native = generate("smollm2-135m-instruct", True, calls, prompts=prompts, served=served)
    if not served[0]:  # avx2: the quantized matmul fuses up to 96 rows (quant_ops.QUANT_MATMUL_MAX_ROWS)
        pytest.skip(f"the {build.kernel_level(torch.float32)} level's quantized kernels do not fuse the first "
                    "step's rows: it takes the module path")
    assert calls[0] and sum(calls) >= 20
    engine_rows = LLMEngine.from_model(resolve_model("smollm2-135m-instruct"), EngineConfig(threads=1))
    lengths = [len(engine_rows.tokenizer.encode(p)) for p in prompts]
    assert all(n <= 32 for n in lengths) and sum(lengths) * 576 >= 65536, lengths
    assert native == generate("smollm2-135m-instruct", False, prompts=prompts)


PROMPT_LOOKUP = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
REPEATING = ["1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "a b c d e f g a b c d e f g a b c",
             "def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "The capital of France is"]


@pytest.mark.parametrize("alone", [True, False], ids=["one sequence", "mixed with decodes"])
def test_verification_steps_take_the_native_call_bitwise_equal_to_the_module_path(alone):
    """Prompt lookup drafts up to 4 tokens: each verification is up to 5 rows of one
    sequence, laid out by the runner as one-token rows (each attended by the decode kernel
    through its own position), alone or beside other sequences' decode rows and chunks;
    tokens and logprobs equal the module path's to the bit (SmolLM2 Q4_1; Qwen2.5-Coder's
    biases and k-quants below)."""
    if build.native_decode_layers() is None or build.native_prefill_attention(torch.float32) is None:
        pytest.skip(f"chunks are native where the prefill attention kernel is: {build.kernel_status()}")
    prompts = REPEATING[:1] if alone else REPEATING
    chunk_calls: list[bool] = []
    native = generate("smollm2-135m-instruct", True, prompts=prompts, chunk_calls=chunk_calls,
                      speculative_config=PROMPT_LOOKUP)
    # the prompts' step (the digits' prompt is over MAX_CHUNK_TOKENS) takes the module path
    assert len(chunk_calls) >= 4 and not chunk_calls[0] and all(chunk_calls[1:])
    assert native == generate("smollm2-135m-instruct", False, prompts=prompts, speculative_config=PROMPT_LOOKUP)


@pytest.mark.parametrize("repack", ["0", "1"], ids=["as-laid-out", "repacked"])
def test_verification_steps_of_qwen_with_biases_and_k_quants_are_native_and_bitwise_equal(repack, monkeypatch):
    monkeypatch.setenv("INFERPATH_REPACK", repack)  # Q4_K and Q6_K in the file's layout or by 8 rows
    if build.native_decode_layers() is None or build.native_prefill_attention(torch.float32) is None:
        pytest.skip(f"chunks are native where the prefill attention kernel is: {build.kernel_status()}")
    chunk_calls: list[bool] = []
    native = generate("qwen2.5-coder-0.5b-instruct", True, prompts=REPEATING[1:3], chunk_calls=chunk_calls,
                      speculative_config=PROMPT_LOOKUP)
    assert len(chunk_calls) >= 4 and all(chunk_calls[1:])
    assert native == generate("qwen2.5-coder-0.5b-instruct", False, prompts=REPEATING[1:3],
                              speculative_config=PROMPT_LOOKUP)


@pytest.mark.parametrize("prompt", REPEATING[1:3], ids=["letters", "code"])
def test_verification_rows_are_the_bits_of_plain_decodes_on_repacked_weights(prompt, monkeypatch):
    """A verification's rows are one-token rows (decode attention through each one's own
    position) and the repacked kernels compute each of up to 8 rows of x alone: every
    token and logprob with drafts is the plain decode's to the bit (Qwen2.5-Coder 0.5B, one
    sequence, ngram drafts of up to 4: 5 rows), not only the same argmax."""
    monkeypatch.setenv("INFERPATH_REPACK", "1")
    if build.native_decode_layers() is None or build.kernel_level("quantized") not in REPACK_LEVELS:
        pytest.skip(f"repacked kernels run at {REPACK_LEVELS}: {build.kernel_status()}")
    drafted = generate("qwen2.5-coder-0.5b-instruct", True, prompts=[prompt], speculative_config=PROMPT_LOOKUP)
    assert drafted == generate("qwen2.5-coder-0.5b-instruct", True, prompts=[prompt])


def test_verification_metadata_rows_are_the_bits_of_one_token_steps(monkeypatch):
    """``verification_metadata`` (what benchmarks/verify_step.py times) lays k + 1 tokens out
    as the runner lays out a verification: one-token rows, each attending through its own
    position. On repacked weights each row's logits are then those of a one-token step at
    that position, to the bit, and the step stays in the native call."""
    from inferpath.model.metadata import one_sequence_metadata, verification_metadata

    monkeypatch.setenv("INFERPATH_REPACK", "1")
    if build.native_decode_layers() is None or build.kernel_level("quantized") not in REPACK_LEVELS:
        pytest.skip(f"repacked kernels run at {REPACK_LEVELS}: {build.kernel_status()}")
    engine = LLMEngine.from_model(resolve_model("smollm2-135m-instruct"),
                                  EngineConfig(threads=1, kv_cache_memory_bytes=64 * 2**20))
    model, kv_cache = engine.runner.model, engine.runner.kv_cache
    block_size = kv_cache.k_caches[0].shape[1]
    context, rows = 21, 5
    blocks = -(-(context + rows) // block_size)
    ids = torch.randint(0, model.config.vocab_size, (context + rows,), generator=torch.Generator().manual_seed(3))
    calls: list[bool] = []
    original = model.model._decode_natively

    def watching(*args):
        hidden = original(*args)
        calls.append(hidden is not None)
        return hidden

    with torch.inference_mode():
        model(ids[:context], torch.arange(context), kv_cache, one_sequence_metadata(0, context, blocks, block_size))
        model.model._decode_natively = watching
        positions = torch.arange(context, context + rows)
        together = model.compute_logits(model(ids[context:], positions, kv_cache,
                                              verification_metadata(context, rows, blocks, block_size)))
        assert calls == [True]
        alone = [model.compute_logits(model(ids[context + j:context + j + 1], positions[j:j + 1], kv_cache,
                                            one_sequence_metadata(context + j, 1, blocks, block_size)))
                 for j in range(rows)]
    assert torch.equal(together, torch.cat(alone))


def test_a_traced_verification_step_stays_native_and_times_its_stages():
    """The trace (engine/trace.py) of a speculative request: its verification steps ran the
    native call, which filled the clock's stage buffer (``StepRecord.native_decode``)."""
    from inferpath.engine.trace import trace

    if build.native_decode_layers() is None or build.native_prefill_attention(torch.float32) is None:
        pytest.skip(f"chunks are native where the prefill attention kernel is: {build.kernel_status()}")
    engine = LLMEngine.from_model(resolve_model("smollm2-135m-instruct"),
                                  EngineConfig(threads=1, kv_cache_memory_bytes=64 * 2**20,
                                               speculative_config=PROMPT_LOOKUP))
    with trace(engine) as tracer:
        engine.add_request("0", REPEATING[1], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        steps = tracer.all_steps()
    verifications = [s for s in steps if any(c.draft_token_ids for c in s.chunks)]
    assert verifications and all(s.native_decode for s in verifications)
    assert all(s.stages["attention"] > 0 and s.stages["gate_up_silu"] > 0 for s in verifications)


def test_below_the_prefill_kernels_level_prompt_chunks_step_aside_verifications_stay_native(monkeypatch):
    """At the generic level (the prefill kernel is built at avx2, avxvnni and avx512) the
    module path attends chunks with PyTorch's SDPA, which the native call cannot reproduce
    to the bit: a prompt chunk steps aside; verification steps, one-token rows of decode
    attention, stay native and equal the module path to the bit."""
    monkeypatch.setenv("INFERPATH_ISA", "generic")
    if build.native_decode_layers() is None:
        pytest.skip(build.kernel_status())
    assert build.native_prefill_attention(torch.float32) is None
    chunk_calls: list[bool] = []
    native = generate("smollm2-135m-instruct", True, prompts=REPEATING[:1], chunk_calls=chunk_calls,
                      speculative_config=PROMPT_LOOKUP)
    assert len(chunk_calls) >= 3 and not chunk_calls[0] and all(chunk_calls[1:])
    assert native == generate("smollm2-135m-instruct", False, prompts=REPEATING[:1], speculative_config=PROMPT_LOOKUP)


@pytest.mark.parametrize("repack", ["0", "1"], ids=["as-laid-out", "repacked"])
def test_native_decode_with_biases_and_k_quants(repack, monkeypatch):
    """Qwen2.5-Coder: Q/K/V biases, Q5_0 / Q8_0 / Q4_K / Q6_K weights (Q4_K, Q6_K repacked or not)."""
    monkeypatch.setenv("INFERPATH_REPACK", repack)
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
    mlp.forward = mlp.forward  # an instance attribute, as a wrapper sets
    assert plan.watched()

    def module_path_timer(*args):  # a stage clock's wrapper: it times the module path only
        return type(mlp).forward(mlp, *args)
    setattr(module_path_timer, NATIVE_TIMED, True)
    stack.layers[4].mlp.forward = module_path_timer
    assert plan.watched()  # layer 3's unmarked wrapper still watches
    del mlp.forward
    assert not plan.watched()
    del stack.layers[4].mlp.forward
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
    served: list[bool] = []
    native = generate("smollm2-135m-instruct", True, calls, dtype=dtype, served=served)
    assert sum(calls) >= 20
    # the prompts' step is native where the prefill attention is built (avx2, avxvnni, avx512)
    # and the level's GEMV (or AMX GEMM) serves its rows: below avx512 the portable GEMV takes
    # a few rows only (ops.PORTABLE_GEMV_MAX_ROWS), and the step takes the module path
    assert calls[0] == (build.native_prefill_attention(getattr(torch, dtype)) is not None and served[0])
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
    from inferpath.engine.load import build_for_engine, load_weights

    config = EngineConfig(threads=1, dtype="bfloat16")
    checkpoint, plan = load_weights(bf16_gguf, config)
    assert plan.matrices == "as laid out" and plan.runs == ("bfloat16",)
    pointers = {name: t.data_ptr() for name, t in checkpoint.tensors.items()}
    model = build_for_engine(checkpoint, plan, config)
    attn = model.model.layers[0].self_attn
    if getattr(attn, "_float_qkv", None) is None:
        pytest.skip(build.kernel_status())
    for name, param in model.named_parameters():
        assert param.data_ptr() == pointers[name], name


def test_a_bf16_batch_of_twelve_decodes_natively_where_the_gemv_serves_it():
    """Without AMX the bf16 GEMV serves up to 32 rows (ops.GEMV_MAX_ROWS_WITHOUT_AMX): twelve
    sequences decode natively, three groups of four rows per weight block, bitwise equal
    to the module path. On a CPU with AMX, its AMX flags are simulated away."""
    from inferpath.kernels import ops

    with build.simulated_cpu_flags(remove=build.AMX_FLAGS):
        if build.kernel_level(torch.bfloat16) != "avx512":
            pytest.skip(f"needs the avx512 bf16 GEMV: {build.kernel_status()}")
        assert ops.GEMV_MAX_ROWS_WITHOUT_AMX[torch.bfloat16] >= 12
        prompts = [f"Tell me about the number {n}." for n in range(12)]
        calls: list[bool] = []
        native = generate("smollm2-135m-instruct", True, calls, dtype="bfloat16", prompts=prompts)
        assert sum(calls) >= 20
        assert native == generate("smollm2-135m-instruct", False, dtype="bfloat16", prompts=prompts)


@pytest.fixture
def amx_cpu(monkeypatch):
    """This CPU as one with AMX (simulated where it has none: the AMX GEMM's slot holds its
    portable reference), and a record of the kernel each bf16 matmul ran: (rows, "amx" or
    "gemv"). The AMX GEMM is handed out as a C callback that records each call, so the calls
    the native decode call makes through its address are recorded too (the GEMV's only where
    the module path makes them)."""
    from inferpath.kernels import ops

    with build.simulated_cpu_flags(add=build.AMX_FLAGS):
        amx_fn = build.native_amx_gemm(torch.bfloat16)
        if amx_fn is None:
            pytest.skip(f"no AMX GEMM or reference here: {build.kernel_status()}")
        ran = []

        def amx_call(x, w, bias, y, m, n, k, threads):
            ran.append((m, "amx"))
            return amx_fn(x, w, bias, y, m, n, k, threads)
        recorded_amx = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 3,
                                        ctypes.c_int)(amx_call)
        monkeypatch.setattr(build, "native_amx_gemm", lambda dtype, level=None: recorded_amx)
        original = ops.run_gemv

        def recording(fn, x, weight, bias):
            if x.dtype == torch.bfloat16 and fn is not recorded_amx:
                ran.append((x.shape[0], "gemv"))
            return original(fn, x, weight, bias)
        monkeypatch.setattr(ops, "run_gemv", recording)
        yield ran


def test_bf16_decode_of_a_few_rows_is_native_on_an_amx_cpu(amx_cpu):
    """An AMX CPU's bf16 steps all take the native call, bitwise equal to the module path:
    the prompts' step with its five-plus rows through the AMX GEMM inside the call (as the
    module path runs them), the decode steps of three rows through the GEMV."""
    from inferpath.kernels import ops

    calls: list[bool] = []
    native = generate("smollm2-135m-instruct", True, calls, dtype="bfloat16")
    assert sum(calls) >= 20 and calls[0]
    assert any(kernel == "amx" and rows >= ops.AMX_MIN_ROWS for rows, kernel in amx_cpu)  # the prefill
    assert not any(kernel == "amx" for rows, kernel in amx_cpu if rows < ops.AMX_MIN_ROWS)
    module = generate("smollm2-135m-instruct", False, dtype="bfloat16")
    assert any(kernel == "gemv" for rows, kernel in amx_cpu)  # the module path's decode rows
    assert native == module


def test_bf16_decode_of_five_rows_takes_amx_on_an_amx_cpu(amx_cpu):
    """Five sequences: their decode steps run the AMX GEMM inside the native call, every
    projection of every layer (up to 128 rows; past that, oneDNN in the module path)."""
    prompts = [f"Count to {n}." for n in range(3, 8)]
    engine = LLMEngine.from_model(resolve_model("smollm2-135m-instruct"),
                                  EngineConfig(threads=2, dtype="bfloat16", kv_cache_memory_bytes=64 * 2**20))
    stack = engine.runner.model.model
    steps = []  # (rows, took the native call)
    original = stack._decode_natively

    def recording(input_ids, *args):
        hidden = original(input_ids, *args)
        steps.append((input_ids.shape[0], hidden is not None))
        return hidden
    stack._decode_natively = recording
    native = stack._native_plan()
    assert [native.serves(rows) for rows in (1, 2, 4, 5, 128, 129)] == [True] * 5 + [False]
    assert [native.amx_groups(rows)[1] for rows in (4, 5, 128)] == [0, 0b1111, 0b1111]
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert [rows for rows, _ in steps[1:]] == [5, 5] and all(native for _, native in steps[1:])
    # per decode step, every layer's Q, K, V, o, gate, up and down (the groups one weight at a
    # time); and the LM head's five rows (one a sequence) after each of the three steps
    assert sum(1 for rows, kernel in amx_cpu if rows == 5 and kernel == "amx") == 2 * 30 * 7 + 3


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
