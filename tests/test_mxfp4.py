"""MXFP4 blocks (gpt-oss's expert weights in GGUF) read in place (csrc/quant/mxfp4.c).

Against the ``gguf`` package: its dequantizer (exact equality), and its dequantized
weight in a float32 matmul (within the bound of x's int8 rounding, as every block format
in test_quantized.py), at every instruction-set level this CPU executes (the portable
reference everywhere, the AVX2 branch at the avx2 and avx512 levels).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from inferpath.kernels import build, ops
from inferpath.kernels.quantized import QuantEmbedding, QuantLinear
from inferpath.weights.quantized import QUANTIZED_TYPES, QuantizedTensor
from test_quantized import activation_bound, isa  # noqa: F401 (isa: the level fixture)

MXFP4 = GGMLQuantizationType.MXFP4
ROWS = [1, 3, 8, 13, 64]  # one row (decode), a short tile, a whole tile, tiles and a tail, many


def mxfp4_weight(rows: int, cols: int, seed: int, raw: bool = False) -> QuantizedTensor:
    """``rows`` x ``cols`` MXFP4 blocks: random floats quantized by the gguf package, or
    (``raw``) random nibbles under random exponents, subnormal scales (e < 2) included."""
    rng = np.random.default_rng(seed)
    if raw:
        data = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
        data[:, :, 0] = rng.choice(np.array([0, 1, 2, 100, 120, 127, 128, 130, 140, 200], dtype=np.uint8),
                                   (rows, cols // 32))
        data = data.reshape(rows, -1)
    else:
        values = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 3, (rows, 1))
        data = quants.quantize(values.astype(np.float32), MXFP4)
    return QuantizedTensor(torch.from_numpy(np.ascontiguousarray(data)), MXFP4, (rows, cols))


def test_mxfp4_is_a_format_read_in_place():
    assert MXFP4 in QUANTIZED_TYPES and GGML_QUANT_SIZES[MXFP4] == (32, 17)


@pytest.mark.parametrize("raw", [False, True], ids=["quantized", "raw-bytes"])
@pytest.mark.parametrize("shape", [(1, 32), (3, 64), (7, 224), (16, 96)])
def test_mxfp4_dequantize_equals_the_gguf_package(shape, raw, isa):
    weight = mxfp4_weight(*shape, seed=sum(shape), raw=raw)
    ours = ops.run_dequantize(build.native_quant_dequantize(), weight.data, int(MXFP4), weight.shape[1])
    assert torch.equal(ours, weight.dequantize())


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("raw", [False, True], ids=["quantized", "raw-bytes"])
def test_mxfp4_matmul_within_the_activation_rounding(rows, raw, isa):
    """37 outputs (odd), 9 blocks a row; the fused kernel and QuantLinear's dispatch."""
    weight = mxfp4_weight(37, 9 * 32, seed=rows, raw=raw)
    exact_w = weight.dequantize()  # (37, 288) the gguf package's values (raw: scales 2^-128..2^72)
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 9 * 32, generator=gen) * torch.rand(rows, 1, generator=gen) * 4
    bias = torch.randn(37, generator=gen)
    exact = x @ exact_w.T + bias
    bound = activation_bound(x, exact_w) * 1.001 + 1e-4 * (x.abs() @ exact_w.abs().T) + 1e-5
    fused = ops.run_quant_matmul(build.native_quant_matmul(), x, weight.data, int(MXFP4), bias, 37)
    assert ((fused - exact).abs() <= bound).all(), (fused - exact).abs().max()
    assert (fused - exact).abs().max() > 0  # the kernel does quantize x
    out = QuantLinear(weight, bias.clone())(x)
    assert out.shape == (rows, 37) and ((out - exact).abs() <= bound).all()


def test_mxfp4_embedding_rows_are_the_dequantized_rows(isa):
    weight = mxfp4_weight(50, 96, seed=5)
    ids = torch.tensor([3, 0, 49, 3])
    assert torch.equal(QuantEmbedding(weight)(ids), weight.dequantize()[ids])
