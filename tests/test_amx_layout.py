"""The AMX bf16 GEMM's tile layout and its dispatch, on every CPU.

csrc/drivers/amx_tiles.h holds the packing the AMX kernel (csrc/avx512/amx.c) uses;
csrc/drivers/amx_reference.c runs the same layout through a plain-C TDPBF16PS, built at
every level. Here: the packing against PyTorch's view of it, the reference against a
PyTorch model of the instruction's sums (to the bit) and against the float32 product,
the real kernel against the reference where the CPU has AMX, and which kernel each row
count of a bf16 matrix takes on an AMX CPU (``build.simulated_cpu_flags``: the AMX slot
then holds the reference, so an engine runs its AMX path on a CPU without AMX).
"""

from __future__ import annotations

import pytest
import torch

from inferpath.kernels import build, ops
from inferpath.model.batch_invariant import row_invariant_dispatch

AMX_SHAPES = [(1, 576, 576), (5, 960, 576), (17, 100, 64), (32, 48, 96), (33, 48, 160), (50, 64, 96),
              (64, 35, 32), (70, 20, 64)]  # (m, n, k): around the 16-column tiles and 64-row packs


@pytest.fixture(params=build.LEVEL_NAMES)
def isa(request, monkeypatch):
    level = request.param
    if not build.can_run(level):
        pytest.skip(f"this CPU cannot execute the {level} level (its best is {build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", level)
    if build.native_amx_reference_gemm() is None:
        pytest.skip(build.kernel_status())
    return level


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def run(fn, x, w, bias):
    out = torch.empty((x.shape[0], w.shape[0]), dtype=torch.bfloat16)
    status = fn(x.data_ptr(), w.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
                x.shape[0], w.shape[0], x.shape[1], 1)
    assert status == 0
    return out


def sdm_model(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x @ w.T + bias as TDPBF16PS computes it over 32-value k-steps (the Intel SDM): per
    step, the even and the odd value of each pair accumulate in float32 lanes of their own,
    then their sum adds to the output; bf16 products are exact in float32, so each FMA
    is a product and one rounded addition. Outputs rounded to bf16 once, after the bias.
    (The n % 16 rows past the last tile: a plain dot product in order.)"""
    m, k = x.shape
    n = w.shape[0]
    xf, wf = x.float(), w.float()
    n16 = n // 16 * 16
    acc = torch.zeros((n, m))
    for s in range(0, k, 32):
        even, odd = torch.zeros((n16, m)), torch.zeros((n16, m))
        for p in range(16):
            even = even + wf[:n16, s + 2 * p, None] * xf[None, :, s + 2 * p]
            odd = odd + wf[:n16, s + 2 * p + 1, None] * xf[None, :, s + 2 * p + 1]
        acc[:n16] = acc[:n16] + (even + odd)
    for i in range(k):
        acc[n16:] = acc[n16:] + wf[n16:, i, None] * xf[None, :, i]
    return (acc.T + (0 if bias is None else bias.float())).bfloat16()


def test_the_packing_is_x_transposed_in_pairs(isa):
    """xp[p][j][t] = x[j][2p + t] for 64 columns j, zeros from the last row of x up to a
    multiple of 16."""
    for rows, k in [(1, 32), (16, 64), (17, 96), (50, 32), (64, 64)]:
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows + k)).bfloat16()
        xp = torch.full((k // 2, 64, 2), 7.0, dtype=torch.bfloat16)
        assert build.native_amx_pack_x()(x.data_ptr(), k, rows, xp.data_ptr()) == 0
        padded = (rows + 15) // 16 * 16
        assert torch.equal(bits(xp[:, :rows]), bits(x.view(rows, k // 2, 2).transpose(0, 1)))
        assert torch.equal(xp[:, rows:padded], torch.zeros(k // 2, padded - rows, 2, dtype=torch.bfloat16))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("m,n,k", AMX_SHAPES)
def test_the_reference_is_the_instructions_sums_and_the_float32_product(isa, m, n, k, with_bias):
    gen = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None
    out = run(build.native_amx_reference_gemm(), x, w, bias)
    assert torch.equal(bits(out), bits(sdm_model(x, w, bias)))
    exact = x.float() @ w.float().T + (bias.float() if with_bias else 0)
    assert ((out.float() - exact).abs() <= exact.abs() * 2**-8 + 1e-4 * k).all()


def test_denormal_inputs_count_as_zero(isa):
    """TDPBF16PS reads denormal bf16 inputs as zero (so does the reference)."""
    x = torch.ones(1, 32, dtype=torch.bfloat16)
    w = torch.zeros(16, 32, dtype=torch.bfloat16)
    w[:, 0] = 1e-39  # a bf16 denormal
    w[:, 1] = 2.0
    out = run(build.native_amx_reference_gemm(), x, w, None)
    assert torch.equal(out, torch.full((1, 16), 2.0, dtype=torch.bfloat16))


@pytest.mark.skipif(not build.AMX_FLAGS <= build._probed_cpu_flags(),
                    reason=f"this CPU lacks {sorted(build.AMX_FLAGS - build._probed_cpu_flags())}: "
                           "the reference alone is tested")
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("m,n,k", AMX_SHAPES)
def test_the_amx_kernel_equals_its_portable_reference(m, n, k, with_bias):
    amx = build.native_amx_gemm(torch.bfloat16)
    if amx is None:
        pytest.skip(build.kernel_status())
    gen = torch.Generator().manual_seed(m * n + k + 1)
    x = torch.randn(m, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None
    out, reference = run(amx, x, w, bias), run(build.native_amx_reference_gemm("avx512"), x, w, bias)
    # the SDM's order should give the bit; allow a few outputs one bf16 rounding apart
    assert (out == reference).float().mean() >= 0.99
    torch.testing.assert_close(out.float(), reference.float(), rtol=2**-7, atol=1e-3)


def test_which_kernel_each_row_count_takes():
    """The decision alone (no kernel runs), for kernels present or not."""
    gemv, amx = object(), object()
    with_amx = ops.LinearKernels(gemv, amx, ops.gemv_max_rows(torch.bfloat16, "avx512", amx=True))
    assert [ops.float_kernel_for(r, with_amx) for r in (1, 4, 5, 128, 129)] == ["gemv"] * 2 + ["amx"] * 2 + ["torch"]
    without = ops.LinearKernels(gemv, None, ops.gemv_max_rows(torch.bfloat16, "avx512", amx=False))
    assert [ops.float_kernel_for(r, without) for r in (1, 32, 33)] == ["gemv", "gemv", "torch"]
    portable = ops.LinearKernels(gemv, None, ops.gemv_max_rows(torch.bfloat16, "avx2", amx=False))
    assert [ops.float_kernel_for(r, portable) for r in (4, 5)] == ["gemv", "torch"]
    with row_invariant_dispatch():  # rows independent of the batch: the GEMV for any count
        assert ops.float_kernel_for(64, with_amx) == "gemv"
        assert ops.float_kernel_for(1, ops.LinearKernels(None, amx, 0)) == "torch"
    assert ops.float_kernel_for(ops.AMX_MIN_ROWS - 1, with_amx) == "gemv"


def test_a_simulated_amx_cpu_dispatches_as_one(isa):
    """With amx_tile and amx_bf16 simulated, a bf16 matrix at the avx512 level gets the AMX
    slot (the reference here) for 5 to 128 rows, the GEMV for 1 to 4; below avx512, no AMX.
    Leaving the simulation restores this CPU's own choice."""
    if build.kernel_level(torch.bfloat16) is None:
        pytest.skip(build.kernel_status())
    w = torch.randn(64, 576).bfloat16()
    real = build.native_amx_gemm(torch.bfloat16)
    with build.simulated_cpu_flags(add=build.AMX_FLAGS):
        kernels = ops.linear_kernels(w, None)
        if build.kernel_level(torch.bfloat16) != "avx512":
            assert kernels.amx is None
            return
        assert kernels.amx is not None and "AMX GEMM" in build.kernel_status()
        if real is None:
            assert "simulated" in build.kernel_status()
        assert [ops.float_kernel_for(r, kernels) for r in (1, 4, 5, 128, 129)] == \
            ["gemv", "gemv", "amx", "amx", "torch"]
        assert ops.linear_kernels(torch.randn(64, 100).bfloat16(), None).amx is None  # k % 32
        x = torch.randn(7, 576).bfloat16()
        torch.testing.assert_close(ops.small_batch_linear(x, w, None, kernels).float(),
                                   (x.float() @ w.float().T), rtol=2**-7, atol=1e-2)
    with build.simulated_cpu_flags(remove=build.AMX_FLAGS):
        assert ops.linear_kernels(w, None).amx is None
        assert "no AMX GEMM: this CPU lacks amx_bf16, amx_tile" in build.kernel_status()
    assert build.native_amx_gemm(torch.bfloat16) is real


def test_only_amx_flags_may_be_simulated_present():
    with pytest.raises(ValueError, match="adds only AMX flags.*avx512f"):
        with build.simulated_cpu_flags(add={"avx512f"}):
            pass
