"""The native CPU kernels (inferpath.kernels) against PyTorch, at every instruction-set level
this machine can execute (generic and avx2 on any x86-64 CPU, avx512 where present; the
``isa`` fixture forces each with INFERPATH_ISA and skips, saying so, a level the CPU lacks).

float32 must agree with ``F.linear`` to float rounding; bfloat16 is checked against the
float32 product of the same bf16 inputs, within one bf16 rounding of the result. PyTorch's
fallback path is tested too, by forcing it.
"""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inferpath.kernels import (
    CPULinear,
    CPURMSNorm,
    CPUSiluAndMul,
    accelerate,
    argmax_rows,
    gemv,
    gemv_available,
    kernel_status,
)
from inferpath.kernels import build as kernel_build
from inferpath.kernels import isa as kernel_isa
from inferpath.kernels import libraries as kernel_libraries
from inferpath.kernels import ops as kernel_ops
from inferpath.model.layers import RMSNorm, SiluAndMul

SHAPES = [  # (rows of x, out_features, in_features): multiples of the 4-row block and of
    (1, 576, 576),  # the 16/32-wide vectors, and every kind of remainder
    (2, 197, 100),
    (3, 5, 33),
    (4, 1536, 576),
    (1, 1, 1),
    (4, 7, 47),
    (8, 96, 64),  # two groups of 4 rows
    (9, 13, 40),  # and a group of 1
]

native = pytest.mark.skipif(not gemv_available(torch.float32),
                            reason=f"no native kernel here: {kernel_status()}")


@pytest.fixture(params=kernel_build.LEVEL_NAMES)
def isa(request, monkeypatch):
    """Force one instruction-set level for the test (INFERPATH_ISA); skip one this CPU
    cannot execute; fail if one it can execute did not build."""
    level = request.param
    if not kernel_build.can_run(level):
        pytest.skip(f"this CPU cannot execute the {level} level (its best is {kernel_build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", level)
    built, reason = kernel_build.resolve_level("float32", level)
    if built is None:
        pytest.skip(f"no native kernel here: {reason}")
    assert built == level, f"the {level} kernels did not build: {reason}"
    return level


@native
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_float32_gemv_equals_linear(m, n, k, with_bias, isa):
    gen = torch.Generator().manual_seed(n * k + m)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    bias = torch.randn(n, generator=gen) if with_bias else None
    out = gemv(x, w, bias)
    assert out.shape == (m, n) and out.dtype == torch.float32
    torch.testing.assert_close(out, F.linear(x, w, bias), rtol=1e-5, atol=1e-5 * k ** 0.5)


@native
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_bfloat16_gemv_is_the_float32_product_rounded_once(m, n, k, with_bias, isa):
    gen = torch.Generator().manual_seed(n * k + m)
    x = torch.randn(m, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None
    out = gemv(x, w, bias)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    exact = x.float() @ w.float().T + (bias.float() if with_bias else 0)
    # one rounding to bf16 (8 bits of mantissa) plus float32 summation-order noise
    assert ((out.float() - exact).abs() <= exact.abs() * 2**-8 + 1e-4 * k).all()
    # and nearly always the very value PyTorch's bf16 linear gives
    assert (out == F.linear(x, w, bias)).float().mean() >= 0.99


@native
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("m,n,k", SHAPES + [(17, 37, 65), (64, 11, 576)])
def test_bf16_weights_gemv_is_the_float32_product_of_the_widened_weights(m, n, k, with_bias, isa):
    """float32 x against bf16 weights (a BF16 file on a CPU without bf16 arithmetic): the
    weights widen exactly, so the result is the float32 product up to summation order; and
    each row is the value it has computed alone (the kernel's rows are independent), and a
    group of matrices gives each matrix's columns as the single-matrix call does."""
    gen = torch.Generator().manual_seed(n * k + m)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen) if with_bias else None
    fn = kernel_build.native_gemv_bf16_weights()
    assert fn is not None, kernel_status()
    out = kernel_ops.run_gemv(fn, x, w, bias)
    assert out.shape == (m, n) and out.dtype == torch.float32
    torch.testing.assert_close(out, F.linear(x, w.float(), bias), rtol=1e-5, atol=1e-5 * k ** 0.5)
    for j in {0, m - 1}:
        assert torch.equal(kernel_ops.run_gemv(fn, x[j:j + 1], w, bias), out[j:j + 1])
    group = kernel_build.native_gemv_group_bf16_weights()
    w2 = torch.randn(5, k, generator=gen).bfloat16()
    b2 = torch.randn(5, generator=gen) if with_bias else None
    both = torch.empty(m, n + 5)
    weights = (ctypes.c_void_p * 2)(w.data_ptr(), w2.data_ptr())
    biases = (ctypes.c_void_p * 2)(*(None if b is None else b.data_ptr() for b in (bias, b2)))
    assert group(2, weights, (ctypes.c_int64 * 2)(n, 5), biases, x.data_ptr(), both.data_ptr(), m, k, 2) == 0
    assert torch.equal(both[:, :n], out)
    assert torch.equal(both[:, n:], kernel_ops.run_gemv(fn, x, w2, b2))


@pytest.mark.parametrize("rows", [1, 3, 200])
def test_a_bf16_linear_meeting_float32_x_is_the_widened_product(rows, isa):
    """``CPULinear`` with bf16 weights and a float32 bias, float32 x: the GEMV for a few rows,
    widened tiles and PyTorch's GEMM for many (200 rows: past every level's cutoff); the
    same values as ``F.linear`` over the widened weights either way."""
    gen = torch.Generator().manual_seed(rows)
    linear = nn.Linear(96, 70)
    linear.weight.data = torch.randn(70, 96, generator=gen).bfloat16()
    linear.bias.data = torch.randn(70, generator=gen)
    linear.__class__ = CPULinear
    linear.prepare()
    assert linear._widening_kernels[0] is not None, kernel_status()
    x = torch.randn(rows, 96, generator=gen)
    out = linear(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, F.linear(x, linear.weight.float(), linear.bias), rtol=1e-5, atol=1e-4)


amx = pytest.mark.skipif(kernel_build.native_amx_gemm(torch.bfloat16) is None,
                         reason=f"no AMX kernel here: {kernel_status()}")


@amx
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 576, 576), (5, 960, 576), (17, 100, 64), (32, 3072, 576),
                                   (33, 48, 1536), (50, 64, 96), (64, 1536, 576), (96, 35, 32)])
def test_amx_gemm_is_the_float32_product_rounded_once(m, n, k, with_bias):
    """Row counts around the 16-column tiles and 32-row chunks, weights with a leftover
    n % 16 rows and an odd number of 16-row blocks."""
    gen = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None
    out = kernel_ops.run_gemv(kernel_build.native_amx_gemm(torch.bfloat16), x, w, bias)
    exact = x.float() @ w.float().T + (bias.float() if with_bias else 0)
    assert ((out.float() - exact).abs() <= exact.abs() * 2**-8 + 1e-4 * k).all()
    assert (out == F.linear(x, w, bias)).float().mean() >= 0.99


def test_fallback_without_the_native_kernel(monkeypatch):
    monkeypatch.setattr(kernel_build, "native_gemv", lambda dtype: None)
    x, w, b = torch.randn(2, 40), torch.randn(9, 40), torch.randn(9)
    assert torch.equal(gemv(x, w, b), F.linear(x, w, b))
    layer = nn.Linear(40, 9)
    accelerate(layer)
    assert isinstance(layer, CPULinear) and layer._kernels[0] is None
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_other_dtypes_and_layouts_use_torch():
    x, w = torch.randn(3, 24), torch.randn(5, 24)
    xh, wh = x.half(), w.half()  # float16: no native kernel
    assert torch.equal(gemv(xh, wh), F.linear(xh, wh))
    w_t = torch.randn(24, 5).T  # a transposed (non-contiguous) weight
    assert torch.equal(gemv(x, w_t), F.linear(x, w_t))


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("INFERPATH_KERNELS", "0")
    monkeypatch.setattr(kernel_isa, "_loaded", {})
    assert not gemv_available(torch.float32)
    assert "INFERPATH_KERNELS=0" in kernel_status()
    monkeypatch.setattr(kernel_isa, "_loaded", {})  # undo the cached verdict
    monkeypatch.delenv("INFERPATH_KERNELS")


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n", [(1, 576), (4, 896), (2, 33), (3, 7)])
def test_rms_norm_kernel_equals_the_module(dtype, m, n, isa):
    if not gemv_available(dtype):
        pytest.skip(kernel_status())
    gen = torch.Generator().manual_seed(m * n)
    reference = RMSNorm(n, 1e-5).to(dtype)
    with torch.no_grad():
        reference.weight.copy_(1 + 0.3 * torch.randn(n, generator=gen))
    x = (3 * torch.randn(m, n, generator=gen)).to(dtype)
    fast = RMSNorm(n, 1e-5).to(dtype)
    fast.load_state_dict(reference.state_dict())
    assert accelerate(fast) == 1 and isinstance(fast, CPURMSNorm) and fast._kernel is not None
    expected, out = reference(x), fast(x)
    assert out.dtype == dtype and out.shape == (m, n)
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    else:  # same rounding order as transformers: equal but for rare 1-ulp ties
        assert (out == expected).float().mean() >= 0.98
        assert ((out.float() - expected.float()).abs() <= expected.float().abs() * 2**-7 + 1e-6).all()
    many = x.repeat(40, 1)  # a prefill's rows: split over threads
    if dtype == torch.float32:
        torch.testing.assert_close(fast(many), reference(many), rtol=1e-6, atol=1e-6)
    else:
        assert (fast(many) == reference(many)).float().mean() >= 0.98


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1536), (3, 37), (300, 1536)])
def test_silu_mul_kernel_equals_the_module(dtype, shape, isa):
    if not gemv_available(dtype):
        pytest.skip(kernel_status())
    gen = torch.Generator().manual_seed(shape[1])
    gate = (4 * torch.randn(shape, generator=gen)).to(dtype)
    up = torch.randn(shape, generator=gen).to(dtype)
    expected = SiluAndMul()(gate.clone(), up)
    fast = SiluAndMul()
    assert accelerate(fast) == 1 and isinstance(fast, CPUSiluAndMul)
    target = gate.clone()
    out = fast(target, up)
    assert out.data_ptr() == target.data_ptr()  # in place, like the module it replaces
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    else:
        assert (out == expected).float().mean() >= 0.98
        torch.testing.assert_close(out.float(), expected.float(), rtol=2**-7, atol=1e-5)


@native
@pytest.mark.parametrize("shape", [(1, 49152), (32, 49152), (3, 17), (2, 1)])
def test_argmax_equals_torch_with_ties_and_nan(shape, isa):
    gen = torch.Generator().manual_seed(shape[1])
    logits = torch.randn(shape, generator=gen)
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
    tied = logits.clone()
    tied[:, -1] = tied[:, 0] = tied.max() + 1  # ties: the first index wins
    assert torch.equal(argmax_rows(tied), tied.argmax(dim=-1))
    if shape[1] > 5:
        tied[0, 5] = float("nan")  # a NaN row: the first NaN, as torch answers
        tied[-1] = float("-inf")
        assert torch.equal(argmax_rows(tied), tied.argmax(dim=-1))


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,tokens", [(64, 1), (64, 70), (128, 3)])
def test_rope_kernel_equals_the_module_on_fused_views(dtype, head_dim, tokens, isa):
    if not gemv_available(dtype):
        pytest.skip(kernel_status())
    from inferpath.config import ModelConfig
    from inferpath.kernels.modules import CPURotaryEmbedding
    from inferpath.model.rope import RopeTable, RotaryEmbedding

    config = ModelConfig(architecture="llama", vocab_size=8, hidden_size=4 * head_dim, intermediate_size=8,
                         num_layers=1, num_heads=4, num_kv_heads=2, head_dim=head_dim, rope_theta=500000.0)
    table = RopeTable(config)
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, 8 * head_dim, generator=gen).to(dtype)  # a fused projection's output
    q = qkv[:, :4 * head_dim].view(tokens, 4, head_dim)  # strided rows, as CPUSelfAttention makes
    k = qkv[:, 4 * head_dim:6 * head_dim].view(tokens, 2, head_dim)
    positions = torch.randint(0, 3000, (tokens,), generator=gen)
    table.begin_step(positions, dtype, 3000)
    expected = RotaryEmbedding(table)(positions, q, k)
    fast = RotaryEmbedding(table)
    assert accelerate(fast) == 1 and isinstance(fast, CPURotaryEmbedding)
    for out, ref in zip(fast(positions, q, k), expected):
        assert out.shape == ref.shape and out.is_contiguous()
        if dtype == torch.float32:
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        else:  # rounded once here, twice in PyTorch's multiply then addcmul
            torch.testing.assert_close(out.float(), ref.float(), rtol=2**-7, atol=2**-7)


@native
def test_status_names_the_level_and_each_kernel_family(isa):
    status = kernel_status()
    assert f"ISA level: {isa} (this CPU: {kernel_build.cpu_level()}; INFERPATH_ISA={isa})" in status, status
    for family in kernel_build.FAMILIES:
        level = kernel_build.kernel_level(family)
        # bf16 at avx512 needs AVX512-BF16 too; without it the avx2 level serves bf16
        assert level == (isa if kernel_build.can_run(isa, family) else "avx2"), (family, status)
        assert f"{family} {kernel_build.KERNEL_NAMES[family]}" in status
        assert f": native {level} (" in status.split(f"{family} ", 1)[1].splitlines()[0], status
    assert kernel_build.native_amx_gemm(torch.bfloat16) is None or isa == "avx512"


def test_isa_names_a_level_or_is_refused(monkeypatch):
    monkeypatch.setenv("INFERPATH_ISA", "sse9")
    with pytest.raises(ValueError, match="INFERPATH_ISA='sse9'.*generic, avx2, avxvnni, avx512"):
        kernel_build.active_level()
    assert "INFERPATH_ISA='sse9'" in kernel_status()


def test_a_cpu_with_avx2_only_runs_the_avx2_level(monkeypatch):
    """As on AMD Zen 2/3 or an Intel client CPU: no AVX-512 flag, so avx2 is the best level,
    and asking for avx512 gets avx2 (never a level the CPU cannot execute)."""
    monkeypatch.setattr(kernel_isa, "_cpu_flags", lambda: frozenset({"sse2", "avx", "avx2", "fma", "f16c"}))
    monkeypatch.setattr(kernel_isa, "_loaded", {})
    monkeypatch.setenv("INFERPATH_ISA", "avx512")
    assert kernel_build.cpu_level() == "avx2" and kernel_build.active_level() == "avx2"
    assert not kernel_build.can_run("avx512")
    if shutil.which("gcc"):
        status = kernel_status()
        assert "float32 gemv" in status and ": native avx2 (" in status and "avx512" not in status.split("\n", 1)[1]


@pytest.mark.parametrize("flags,best,forced_vnni", [
    ({"avx2", "fma", "f16c", "avx_vnni"}, "avxvnni", "avxvnni"),  # Intel Alder Lake and later client cores
    ({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}, "avx512", "avx2"),  # Zen 4, Ice Lake
    ({"avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}, "avx512", "avxvnni"),
])
def test_the_avxvnni_level_runs_only_where_the_cpu_has_avx_vnni(flags, best, forced_vnni, monkeypatch):
    """AVX-VNNI (VEX vpdpbusd) is its own flag: a client core without AVX-512 has it, an
    AVX-512 core may lack it. The best level is the highest the flags allow, and forcing
    avxvnni where the flag is missing runs the level below (avx2), never an instruction the
    CPU lacks."""
    monkeypatch.setattr(kernel_isa, "_cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(kernel_isa, "_loaded", {})
    assert kernel_build.cpu_level() == best
    monkeypatch.setenv("INFERPATH_ISA", "avxvnni")
    assert kernel_build.active_level() == forced_vnni
    assert kernel_build.can_run("avxvnni") == ("avx_vnni" in flags)


def test_a_failed_level_leaves_the_others_standing(monkeypatch):
    """A level whose compiler call fails (here: an unknown flag) falls back to the level
    below it, and the status says why."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    broken = kernel_build.Level("avx2", ("portable", "quant"), ("-mno-such-flag-anywhere",), frozenset())
    monkeypatch.setitem(kernel_isa._LEVEL, "avx2", broken)
    monkeypatch.setattr(kernel_isa, "_loaded", {})
    monkeypatch.setenv("INFERPATH_ISA", "avx2")
    assert kernel_build.kernel_level(torch.float32) == "generic"
    status = kernel_status()
    assert ": native generic (" in status and "avx2: " in status and "failed" in status, status
    x, w = torch.randn(2, 40), torch.randn(3, 40)
    torch.testing.assert_close(gemv(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_the_compiler_call_times_out(monkeypatch):
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    slow = kernel_build.Level("generic", ("portable", "quant"), ("-DINFERPATH_TIMEOUT_TEST",), frozenset())
    monkeypatch.setitem(kernel_isa._LEVEL, "generic", slow)
    monkeypatch.setattr(kernel_libraries, "COMPILE_TIMEOUT_S", 0.01)
    monkeypatch.setattr(kernel_isa, "_loaded", {})
    lib, reason = kernel_build._library("generic")
    assert lib is None and "took more than" in reason


@native
def test_accelerated_linear_keeps_names_hooks_and_state_dict(isa):
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8, bias=False))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(1, 64)
    expected = model(x)
    seen = []
    model[0].register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    assert accelerate(model) == 2
    assert accelerate(model) == 2  # idempotent
    assert all(isinstance(model[i], CPULinear) for i in (0, 2)) and model[0]._kernels[0] is not None
    torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-6)
    assert seen == [(1, 32)]  # the hook still fires on the decode path
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


@native
def test_real_model_greedy_tokens_unchanged_by_the_kernels():
    """SmolLM2 fp32, a batch of 3 decoding together (the kernel's 3-row path): the same
    greedy tokens with and without the native kernels."""
    from inferpath.config import EngineConfig
    from inferpath.engine import LLMEngine
    from inferpath.sampling.params import SamplingParams

    prompts = ["What is a quadratic equation?", "Name three rivers in Europe.", "def fib(n):"]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    outputs = {}
    for cpu_kernels in (False, True):
        engine = LLMEngine.from_model("smollm2-135m-instruct", EngineConfig(dtype="float32", cpu_kernels=cpu_kernels))
        model = engine.runner.model
        assert any(isinstance(m, CPULinear) for m in model.modules()) == cpu_kernels
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, params)
        done = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.outputs[0].token_ids
        outputs[cpu_kernels] = [done[str(i)] for i in range(len(prompts))]
    assert outputs[True] == outputs[False]
    assert all(len(ids) == 24 for ids in outputs[True])


@pytest.mark.skipif(not gemv_available(torch.bfloat16), reason=f"no native bf16 kernel here: {kernel_status()}")
@torch.inference_mode()
def test_real_model_bf16_decode_logits_close_with_the_kernels():
    from inferpath.cache.kv import KVCache
    from inferpath.model import AttentionMetadata, build_model
    from inferpath.models import resolve_model
    from inferpath.weights import load_checkpoint

    checkpoint = load_checkpoint(resolve_model("smollm2-135m-instruct"), dtype=torch.bfloat16)
    plain = build_model(checkpoint, torch.bfloat16)
    fast = build_model(checkpoint, torch.bfloat16)
    accelerate(fast)

    def run(model, tokens):  # prefill then 8 teacher-forced decode steps, one sequence
        cache = KVCache(model.config, 8, 16, torch.bfloat16)
        logits = []
        for start, chunk in [(0, tokens[:9])] + [(9 + i, [t]) for i, t in enumerate(tokens[9:])]:
            end = start + len(chunk)
            meta = AttentionMetadata(
                slot_mapping=torch.arange(start, end), query_start_loc=torch.tensor([0, len(chunk)]),
                seq_lens=torch.tensor([end]), block_tables=torch.arange(8)[None, :],
                query_lens=[len(chunk)], seq_lens_list=[end], block_size=16)
            hidden = model(torch.tensor(chunk), torch.arange(start, end), cache, meta)
            logits.append(model.compute_logits(hidden[-1:]).float()[0])
        return torch.stack(logits)

    tokens = list(range(1000, 1017))
    a, b = run(plain, tokens), run(fast, tokens)
    scale = a.abs().max()
    assert scale > 5
    assert (a - b).abs().max() <= 0.05 * scale  # bf16 rounding through 30 layers
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.75


@native
@torch.inference_mode()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_projections_read_the_weights_in_place_and_step_aside_for_hooks(isa, dtype):
    """Q/K/V and gate/up run as one GEMV call each over the separate weights, read where
    they lie (every parameter keeps its storage: no concatenated copy), with outputs equal
    to the bit to the projections one by one; a hook on q_proj gets the unfused path."""
    from inferpath.config import ModelConfig
    from inferpath.kernels.fused import CPUSelfAttention, CPUSwiGLUMLP
    from inferpath.model import Transformer

    config = ModelConfig(architecture="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=True)
    model = Transformer(config, dtype=dtype)
    model.init_random_weights(seed=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pointers = {k: v.data_ptr() for k, v in model.named_parameters()}
    accelerate(model)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert isinstance(attn, CPUSelfAttention) and isinstance(mlp, CPUSwiGLUMLP)
    if attn._float_qkv is None:
        pytest.skip(f"no native {dtype} GEMV here: {kernel_status()}")
    assert attn._float_qkv.num_out == 32 + 16 + 16 and mlp._float_gate_up.num_out == 2 * 48
    assert {k: v.data_ptr() for k, v in model.named_parameters()} == pointers  # nothing copied
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())

    x = torch.randn(3, 32, dtype=dtype)
    fused_q, fused_k, fused_v = attn.project(x)
    for fused, proj in ((fused_q, attn.q_proj), (fused_k, attn.k_proj), (fused_v, attn.v_proj)):
        assert torch.equal(fused.reshape(3, -1), proj(x))  # the single GEMV, bit for bit
    seen = []
    handle = attn.q_proj.register_forward_hook(lambda *args: seen.append(1))
    q, k, v = attn.project(x)
    handle.remove()
    assert seen == [1]
    for a, b in ((fused_q, q), (fused_k, k), (fused_v, v)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    handle = mlp.up_proj.register_forward_hook(lambda *args: seen.append(2))
    unfused = mlp(x)
    handle.remove()
    assert seen == [1, 2]
    torch.testing.assert_close(mlp(x), unfused, rtol=1e-5, atol=1e-6)
