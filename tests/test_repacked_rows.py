"""r8.c's kernel, r8_pair.c's (two groups of eight rows at once, AVX-512 VNNI) and
r8_multi.c's (Q6_K, every row in one walk over a group, AVX2 without VNNI) at 1 to 8 rows of x: against the dequantized float32 reference, equal to the bit across levels (the
portable spec included), and a row's result whatever the rows beside it, with group counts
odd and even and column ranges that start and end inside groups."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from inferpath.kernels import build, ops
from inferpath.kernels.groups import QuantGroup
from inferpath.kernels.repacked import repack
from inferpath.model.batch_invariant import row_invariant_dispatch
from test_quantized import isa, k_quant_tolerance, k_quant_x, k_quant_x_passes_everywhere, kernel_levels, random_weight  # noqa: F401 (isa: a fixture)

Q = GGMLQuantizationType
R8_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
SHAPES = [(40, 3 * 256), (16, 256), (56, 7 * 256)]  # 5 groups (two pairs and one alone), 2, 7


def _x(rows: int, cols: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 4


def _matmul(x: torch.Tensor, packed, level: str | None = None) -> torch.Tensor:
    with row_invariant_dispatch():  # every row through r8.c / r8_pair.c, never gemm.c's panels
        return ops.run_quant_matmul(build.native_quant_matmul(level), x, packed.data, packed.kernel_type, None,
                                    packed.shape[0])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("qtype", R8_TYPES, ids=[t.name for t in R8_TYPES])
def test_one_to_eight_rows_against_the_float_reference(qtype, shape, isa):
    n, k = shape
    weight = random_weight(qtype, n, k, seed=n + k + int(qtype))
    packed, exact_w = repack(weight, drop_source=False), weight.dequantize().double()
    for rows in range(1, 9):
        x = _x(rows, k, rows)
        expected = k_quant_x(x).double() @ exact_w.T
        tolerance = k_quant_tolerance(x, exact_w)
        error = (_matmul(x, packed).double() - expected).abs()
        assert (error <= tolerance).all(), (rows, (error / tolerance).max())


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("qtype", R8_TYPES, ids=[t.name for t in R8_TYPES])
def test_one_to_eight_rows_give_the_same_bits_at_every_level(qtype, passes):
    """x in the same passes at every level (their defaults differ: activations.h)."""
    weight = random_weight(qtype, 40, 3 * 256, seed=5)
    packed = repack(weight, drop_source=False)
    levels = kernel_levels()
    assert levels
    for rows in range(1, 9):
        x = _x(rows, 3 * 256, 10 + rows)
        with k_quant_x_passes_everywhere(passes):
            outs = {level: _matmul(x, packed, level) for level in levels}
        for level, out in outs.items():
            assert torch.equal(out, outs[levels[0]]), (rows, level, levels[0])


@pytest.mark.parametrize("qtype", R8_TYPES, ids=[t.name for t in R8_TYPES])
def test_a_row_gives_its_bits_whatever_the_rows_beside_it(qtype, isa):
    weight = random_weight(qtype, 40, 2 * 256, seed=6)
    packed = repack(weight, drop_source=False)
    x = _x(8, 2 * 256, 3)
    alone = torch.cat([_matmul(x[j:j + 1].contiguous(), packed) for j in range(8)])
    for rows in range(2, 9):
        assert torch.equal(_matmul(x[:rows].contiguous(), packed), alone[:rows]), rows


def test_column_ranges_inside_groups_keep_the_bits(isa):
    """A group call splits its columns where one weight ends: repacked weights of 24 and 40
    rows (3 and 5 groups: a pair, then one alone) beside a 13-row Q4_K weight as laid out
    (a K-quant: x stays in one int8 pass for the whole group)."""
    w1 = repack(random_weight(Q.Q4_K, 24, 512, seed=1), drop_source=False)
    w2 = random_weight(Q.Q4_K, 13, 512, seed=2)
    w3 = repack(random_weight(Q.Q6_K, 40, 512, seed=3), drop_source=False)
    group = QuantGroup(build.native_quant_matmul_group(), [w1, w2, w3], [None, None, None])
    for rows in (1, 2, 5, 8):
        x = _x(rows, 512, rows)
        with row_invariant_dispatch():
            out = group(x)
        assert torch.equal(out[:, :24], _matmul(x, w1)), rows
        assert torch.equal(out[:, 37:], _matmul(x, w3)), rows


def _avx2_or_skip(monkeypatch) -> None:
    if not build.can_run("avx2"):
        pytest.skip(f"this CPU cannot execute the avx2 level (its best is {build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", "avx2")
    built, reason = build.resolve_level("quantized", "avx2")
    if built != "avx2":
        pytest.skip(f"no avx2 kernel here: {reason}")


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("shape", [(24, 35 * 256), (16, 6 * 256)], ids=["24x8960", "16x1536"])
def test_q6_k_rows_in_one_walk_at_avx2(shape, passes, monkeypatch):
    """At avx2 Q6_K's 2..8 rows take r8_multi.c (one walk over a group, quads outer), with x
    in one int8 pass and in two (the avx2 default): the portable spec's bits at every row
    count, a row's bits whatever the rows beside it, and the gguf package's values within
    the activations' int8 rounding; 1.5B's down projection length (35 super-blocks) included."""
    _avx2_or_skip(monkeypatch)
    with k_quant_x_passes_everywhere(passes):
        _q6_k_rows_at_avx2(shape)


def _q6_k_rows_at_avx2(shape):
    n, k = shape
    weight = random_weight(Q.Q6_K, n, k, seed=n + k)
    packed, exact_w = repack(weight, drop_source=False), weight.dequantize().double()
    x = _x(8, k, 21)
    alone = torch.cat([_matmul(x[j:j + 1].contiguous(), packed, "avx2") for j in range(8)])
    for rows in range(2, 9):
        xr = x[:rows].contiguous()
        out = _matmul(xr, packed, "avx2")
        assert torch.equal(out, _matmul(xr, packed, "generic")), rows
        assert torch.equal(out, alone[:rows]), rows
        expected = k_quant_x(xr).double() @ exact_w.T
        assert ((out.double() - expected).abs() <= k_quant_tolerance(xr, exact_w)).all(), rows


def test_q6_k_beside_q8_0_gives_the_spec_bits_at_avx2(monkeypatch):
    """A Q6_K weight fused with a Q8_0 one meets x in two int8 passes at every level: the
    portable spec's bits at 2..8 rows (the Q8_0 weight as laid out is not held to the bit
    across levels)."""
    _avx2_or_skip(monkeypatch)
    w1 = repack(random_weight(Q.Q6_K, 32, 512, seed=7), drop_source=False)
    w2 = random_weight(Q.Q8_0, 16, 512, seed=8)
    for rows in range(2, 9):
        x = _x(rows, 512, 30 + rows)
        outs = {}
        for level in ("avx2", "generic"):
            group = QuantGroup(build.native_quant_matmul_group(level), [w1, w2], [None, None])
            with row_invariant_dispatch():
                outs[level] = group(x)
        assert torch.equal(outs["avx2"][:, :32], outs["generic"][:, :32]), rows
