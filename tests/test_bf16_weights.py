"""A BF16 GGUF on a CPU without bf16 arithmetic (kernels/bf16_weights.py), forced here with
INFERPATH_ISA=avx2: ``--dtype auto`` keeps the matrices bfloat16 views of the mapped file
and runs float32 activations, norms and KV cache through kernels that widen the weights
(exact), so the model is the float32 model of the same file up to the order of float32
sums: same greedy tokens, logprobs within float32 noise, native decode bitwise equal to the
module path, and about half the resident memory of the float32 conversion."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from gguf_files import write_float_gguf
from test_decode_stack import generate

from inferpath.config import EngineConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.kernels import build
from inferpath.models import resolve_model

PROMPTS = ["Tell me about the number 7.", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def bf16_gguf(tmp_path_factory) -> str:
    """The packaged SmolLM2 as a BF16 GGUF (matrices BF16, norms F32: llama.cpp's layout)."""
    path = tmp_path_factory.mktemp("bf16") / "SmolLM2-135M-Instruct.BF16.gguf"
    return str(write_float_gguf(resolve_model("smollm2-135m-instruct"), path))


@pytest.fixture
def avx2(monkeypatch):
    """The AVX2 level (no bf16 arithmetic), or a skip saying why it cannot run."""
    if not build.can_run("avx2"):
        pytest.skip(f"this CPU cannot execute the avx2 level (its best is {build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", "avx2")
    if build.native_gemv_bf16_weights() is None:
        pytest.skip(build.kernel_status())


def engine_for(path: str, dtype: str = "auto") -> LLMEngine:
    return LLMEngine.from_model(path, EngineConfig(threads=2, kv_cache_memory_bytes=64 * 2**20, dtype=dtype))


def _mapped_ranges(path: str) -> list[tuple[int, int]]:
    """This process's address ranges that map ``path``."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == path:
                start, end = (int(a, 16) for a in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def test_auto_keeps_the_matrices_bf16_views_of_the_mapped_file(bf16_gguf, avx2):
    """Every matrix parameter is bfloat16 and lies in the file's mapping (no copy); norms
    are float32; the summary names what runs and counts 2 bytes a weight."""
    from inferpath.explain.cost import Precision
    from inferpath.explain.trace import precision_of

    engine = engine_for(bf16_gguf)
    model = engine.runner.model
    ranges = _mapped_ranges(bf16_gguf)
    assert ranges
    matrices = 0
    for name, param in model.named_parameters():
        if param.dim() == 1:
            assert param.dtype == torch.float32, name
            continue
        matrices += 1
        assert param.dtype == torch.bfloat16, name
        assert any(start <= param.data_ptr() < end for start, end in ranges), name
    assert matrices == 1 + 7 * 30  # the tied embedding / LM head, seven per layer
    assert model.lm_head.weight is model.model.embed_tokens.weight
    weights = engine.weight_format
    assert weights.describe() == "bfloat16 weights, float32 activations, kernels avx2"
    assert weights.weight_bytes == 2 * weights.num_weights
    for precision in (precision_of(engine), Precision.of_gguf(bf16_gguf)):  # trace's, explain's
        assert precision.weight_bytes == 2 and precision.activation_bytes == 4 and precision.compute_dtype == "fp32"
    assert engine.kv_cache.k_caches[0].dtype == torch.float32
    assert model.model.native_decode_refusal() == ""


def test_bf16_weights_give_the_float32_model_of_the_same_file(bf16_gguf, avx2):
    """Against ``--dtype float32`` (every matrix converted at load): the same greedy tokens,
    and top-5 logprobs equal up to float32 summation order."""
    widened = generate(bf16_gguf, native=True, prompts=PROMPTS)
    converted = generate(bf16_gguf, native=True, dtype="float32", prompts=PROMPTS)
    assert widened.keys() == converted.keys()
    for key in widened:
        tokens, logprobs = widened[key]
        assert tokens == converted[key][0], key
        for (token, logprob, top), (token32, logprob32, top32) in zip(logprobs, converted[key][1]):
            assert token == token32 and abs(logprob - logprob32) <= 1e-4 * max(1.0, abs(logprob32))
            assert [t for t, _ in top] == [t for t, _ in top32]
            assert all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for (_, a), (_, b) in zip(top, top32))


def test_bf16_weights_decode_natively_bitwise_equal_to_the_module_path(bf16_gguf, avx2):
    """A decode step is one native call (the widening GEMV inside decode.c), equal to the
    bit to the module-by-module path."""
    calls: list[bool] = []
    served: list[bool] = []
    native = generate(bf16_gguf, native=True, calls=calls, prompts=PROMPTS, served=served)
    # the prompts' step is native where the level builds the prefill attention (avx2 does
    # since csrc/avx2) and the widening GEMV serves its rows; else it takes the module path
    assert sum(calls) >= 20
    assert calls[0] == (build.native_prefill_attention(torch.float32) is not None and served[0])
    assert native == generate(bf16_gguf, native=False, prompts=PROMPTS)


def test_a_bf16_file_run_with_bf16_weights_holds_about_the_file(bf16_gguf):
    """Resident memory of an engine serving the BF16 file under ``--dtype auto`` on the avx2
    level: about the file (its mapped pages) plus the KV cache, not the float32 conversion
    (twice the file: ~540 MB for SmolLM2's 270 MB)."""
    if not build.can_run("avx2"):
        pytest.skip(f"this CPU cannot execute the avx2 level (its best is {build.cpu_level()})")
    # VmHWM: this process's peak resident memory (ru_maxrss would carry pytest's over exec)
    code = ("import sys\n"
            "from inferpath.config import EngineConfig\n"
            "from inferpath.engine.llm_engine import LLMEngine\n"
            "from inferpath.sampling.params import SamplingParams\n"
            "status = lambda key: int(open('/proc/self/status').read().split(key + ':')[1].split()[0]) * 1024\n"
            "before = status('VmRSS')\n"
            "engine = LLMEngine.from_model(sys.argv[1], EngineConfig(threads=1, kv_cache_memory_bytes=32 * 2**20))\n"
            "engine.add_request('0', 'Write a haiku about rain.', SamplingParams(max_tokens=8, temperature=0))\n"
            "while engine.has_unfinished_requests():\n"
            "    engine.step()\n"
            "print(status('VmHWM') - before, engine.weight_format.describe())\n")
    env = {**os.environ, "INFERPATH_ISA": "avx2"}
    done = subprocess.run([sys.executable, "-c", code, bf16_gguf], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr
    added, described = done.stdout.split(maxsplit=1)
    if not described.startswith("bfloat16 weights, float32 activations"):
        pytest.skip(f"the bf16-weight kernels do not run here: {described.strip()}")
    file_bytes = os.path.getsize(bf16_gguf)
    assert int(added) < 1.5 * file_bytes, (int(added), file_bytes)


def test_a_bf16_hugging_face_checkpoint_against_transformers_float32(tmp_path, avx2):
    """A tiny random Llama saved by transformers in bfloat16, loaded with ``--dtype auto``:
    its matrices stay bf16 (untied LM head included), and the logits of a 40-token pass (the
    GEMV's rows) and of each row alone equal transformers' float32 model of the same bf16
    weights to float32 rounding."""
    import transformers  # test-only reference
    from test_quantized import _teacher_forced_logits

    from inferpath.engine.load import build_for_engine, load_weights

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      rms_norm_eps=1e-6, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path)
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    tokens = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0]  # (40, vocab)
    engine_config = EngineConfig(threads=1)
    checkpoint, plan = load_weights(tmp_path, engine_config)
    model = build_for_engine(checkpoint, plan, engine_config)
    assert model.lm_head.weight.dtype == torch.bfloat16 and model.model.norm.weight.dtype == torch.float32
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    for rows_alone in (False, True):
        logits = _teacher_forced_logits(model, tokens, rows_alone=rows_alone)
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
