"""Q4_K and Q6_K repacked into groups of eight rows (kernels/repacked.py, csrc/quant/r8.c)
against the gguf package's dequantized weights, across levels, and row by row."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from inferpath.kernels import build, ops, quant_ops
from inferpath.kernels.groups import QuantGroup
from inferpath.kernels.quantized import QuantLinear
from inferpath.kernels.repacked import REPACK_DEFAULT_LEVELS, REPACK_FORMATS, REPACK_LEVELS, RepackedTensor, kernel_type, repack, repackable
from inferpath.model.batch_invariant import row_invariant_dispatch
from test_quantized import isa, k_quant_tolerance, k_quant_x, k_quant_x_passes_everywhere, kernel_levels, random_weight  # noqa: F401 (isa: a fixture)

Q = GGMLQuantizationType
R8_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
ROWS = [1, 3, 5, 8, 13, 64, 512]


def _matmul(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
    return ops.run_quant_matmul(build.native_quant_matmul(), x, weight.data, kernel_type(weight), bias,
                                weight.shape[0])


def _x(rows: int, cols: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 4


@pytest.mark.parametrize("qtype", R8_TYPES, ids=[t.name for t in R8_TYPES])
def test_repacked_values_are_the_files_to_the_bit(qtype, isa):
    weight = random_weight(qtype, 24, 3 * 256, seed=int(qtype))
    packed = repack(weight, drop_source=False)
    assert packed.data.shape == (24, 3 * {Q.Q4_K: 148, Q.Q5_K: 180, Q.Q6_K: 212}[qtype])
    assert torch.equal(packed.dequantize(), weight.dequantize())


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("qtype", R8_TYPES, ids=[t.name for t in R8_TYPES])
def test_repacked_meets_x_in_one_int8_pass(qtype, rows, isa):
    """As test_quantized's one-pass check: exact up to float32 rounding."""
    cols = 5 * 256
    weight = random_weight(qtype, 40, cols, seed=rows + 3 * int(qtype))
    packed = repack(weight, drop_source=False)
    exact_w = weight.dequantize().double()
    x = _x(rows, cols, rows)
    bias = torch.randn(40)
    expected = k_quant_x(x).double() @ exact_w.T + bias.double()
    fused = _matmul(x, packed, bias).double()
    tolerance = k_quant_tolerance(x, exact_w) + 2e-6 * bias.double().abs()
    assert ((fused - expected).abs() <= tolerance).all(), ((fused - expected).abs() / tolerance).max()


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("qtype", R8_TYPES, ids=[t.name for t in R8_TYPES])
def test_every_level_gives_the_same_bits(qtype, passes):
    """The SIMD kernels and the portable spec run one float chain per row: equal to the bit
    with x in the same passes at every level (5 rows: fewer than gemm.c's panels take,
    R8_GEMM_MIN_ROWS)."""
    weight = random_weight(qtype, 16, 2 * 256, seed=7)
    packed = repack(weight, drop_source=False)
    x = _x(5, 2 * 256, 1)
    outs = {}
    with k_quant_x_passes_everywhere(passes):
        for level in kernel_levels():
            outs[level] = ops.run_quant_matmul(build.native_quant_matmul(level), x, packed.data,
                                               packed.kernel_type, None, 16)
    assert len(outs) >= 1
    first = next(iter(outs.values()))
    for level, out in outs.items():
        assert torch.equal(out, first), level


@pytest.mark.parametrize("qtype", R8_TYPES, ids=[t.name for t in R8_TYPES])
def test_a_row_alone_equals_the_same_row_in_a_tile(qtype, isa):
    """r8.c's kernel: a row's float chain whatever the rows beside it (13 rows where rows
    must be invariant; 5, a verification tile, fewer than gemm.c's panels take anyway)."""
    weight = random_weight(qtype, 32, 4 * 256, seed=11)
    packed = repack(weight, drop_source=False)
    x = _x(13, 4 * 256, 2)
    with row_invariant_dispatch():
        tile = _matmul(x, packed)
    for j in (0, 4, 12):
        assert torch.equal(_matmul(x[j:j + 1].contiguous(), packed), tile[j:j + 1])
    assert torch.equal(_matmul(x[:5].contiguous(), packed), tile[:5])


def test_a_group_mixing_repacked_and_laid_out_weights(isa):
    """Q/K/V with formats that differ (Q6_K repacked, Q5_0 as laid out: x in two passes
    there) side by side, columns split at arbitrary points by the group call."""
    w1 = repack(random_weight(Q.Q6_K, 24, 512, seed=1), drop_source=False)
    w2 = random_weight(Q.Q5_0, 13, 512, seed=2)
    w3 = repack(random_weight(Q.Q4_K, 16, 512, seed=3), drop_source=False)
    biases = [torch.randn(24), None, torch.randn(16)]
    group = QuantGroup(build.native_quant_matmul_group(), [w1, w2, w3], biases)
    for rows in (1, 5, 70):
        x = _x(rows, 512, rows)
        exact = torch.cat([x @ w.dequantize().T + (0 if b is None else b) for w, b in zip([w1, w2, w3], biases)], 1)
        out = group(x)
        scale = x.abs() @ torch.cat([w.dequantize() for w in (w1, w2, w3)]).abs().T
        assert ((out - exact).abs() <= 5e-3 * scale + 1e-4).all(), rows


def test_the_module_runs_repacked_weights_at_every_row_count(isa, monkeypatch):
    """QuantLinear over a RepackedTensor: fused rows (every row count where weights are
    repacked, quant_ops.R8_MATMUL_MAX_ROWS), row-invariant dispatch, and past the fused rows the
    dequantized tiles (tile edges at multiples of 8; the generic level)."""
    monkeypatch.setattr(quant_ops, "DEQUANT_TILE_VALUES", 21 * 256)
    weight = random_weight(Q.Q4_K, 48, 256, seed=4)
    module = QuantLinear(repack(weight, drop_source=False))
    reference = QuantLinear(weight)
    for rows in (1, 8, 200):
        x = _x(rows, 256, rows)
        w = weight.dequantize().double()
        if ops.quant_rows_fused(rows, repacked=True):
            expected = k_quant_x(x).double() @ w.T
            assert ((module(x).double() - expected).abs() <= k_quant_tolerance(x, w)).all(), rows
        else:  # dequantized tiles, as the file's: float32 rounding only
            torch.testing.assert_close(module(x), reference(x), rtol=1e-5, atol=1e-5)
        with row_invariant_dispatch():
            assert torch.equal(module(x)[:1], module(x[:1].contiguous()))


def test_what_cannot_be_repacked_is_refused():
    assert not repackable(random_weight(Q.Q4_K, 12, 256, seed=0))  # 12 rows: not whole groups
    assert not repackable(random_weight(Q.Q4_0, 16, 256, seed=0))
    with pytest.raises(ValueError, match="cannot be repacked by 8 rows"):
        repack(random_weight(Q.Q6_K, 20, 256, seed=0))
    bad = RepackedTensor(torch.zeros(12, 148, dtype=torch.uint8), Q.Q4_K, (12, 256))
    if build.native_quant_matmul() is not None:
        with pytest.raises(RuntimeError, match="quantized matmul rejected"):
            _matmul(torch.randn(1, 256), bad)


@pytest.mark.parametrize("level", build.LEVEL_NAMES)
def test_the_weight_plan_repacks_where_the_kernel_is_simd(level, monkeypatch):
    """The allow-list: Q4_K and Q6_K at the avx2 and avx512 levels with INFERPATH_REPACK=1,
    and by default at REPACK_DEFAULT_LEVELS (avx2, avx512) or when the engine speculates; the
    file's layout with 0; any other value refused."""
    from inferpath.config import EngineConfig
    from inferpath.engine.weight_plan import plan_weights
    from inferpath.models import resolve_model

    if not build.can_run(level):
        pytest.skip(f"this CPU cannot execute the {level} level")
    monkeypatch.setenv("INFERPATH_ISA", level)
    path = resolve_model("qwen2.5-coder-0.5b-instruct")  # Q5_0 + Q8_0 + Q6_K + Q4_K
    monkeypatch.delenv("INFERPATH_REPACK", raising=False)
    default = plan_weights(path, EngineConfig())
    expected = tuple(f for f in default.runs if f in REPACK_FORMATS) if default.kernel_level in REPACK_LEVELS else ()
    assert default.repacked == (expected if default.kernel_level in REPACK_DEFAULT_LEVELS else ())
    assert ("repacked by 8 rows" in default.describe()) == bool(default.repacked)
    # an engine that speculates repacks wherever the kernel is SIMD (its verification rows)
    speculating = EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    assert plan_weights(path, speculating).repacked == expected
    monkeypatch.setenv("INFERPATH_REPACK", "0")
    assert plan_weights(path, speculating).repacked == ()
    monkeypatch.setenv("INFERPATH_REPACK", "1")
    plan = plan_weights(path, EngineConfig())
    assert plan.repacked == expected and ("repacked by 8 rows" in plan.describe()) == bool(expected)
    monkeypatch.setenv("INFERPATH_REPACK", "0")
    off = plan_weights(path, EngineConfig())
    assert off.repacked == () and "repacked" not in off.describe()
    monkeypatch.setenv("INFERPATH_REPACK", "yes")
    with pytest.raises(ValueError, match="INFERPATH_REPACK='yes'"):
        plan_weights(path, EngineConfig())
