"""The quantized GEMM's AMX-INT8 engine: its tile layout, its reference and its dispatch.

gemm.c packs a quantized weight into panels whose groups of four int8 values per column
are AMX's B tiles (csrc/drivers/amx_int8_tiles.h); csrc/drivers/amx_int8_reference.c runs
them through a plain-C TDPBSUD and gemm.c's float epilogue, csrc/avx512/amx_int8.c through
AMX tiles. Here: the tile multiply against integer numpy, the packing against the
dequantized weights, the reference (and, on a CPU with AMX-INT8, the tiles) against the
VNNI GEMM to the bit for every format on the allow-list, the dispatch (which engine the
flags choose, which row counts it takes), and a real model's forward with AMX-INT8
simulated (or real) against the VNNI one, to the bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from inferpath.kernels import build, ops
from inferpath.kernels.repacked import kernel_type, repack
from test_quantized import random_weight
from test_repacked_gemm import R8_GEMM_MIN_ROWS

FILE_TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]
R8_TYPES = ["Q4_K_R8", "Q6_K_R8"]
ENGINES = {name: i for i, name in enumerate(build.AMX_INT8_ENGINES)}
MIN_ROWS = 16  # drivers/amx_int8_tiles.h AMX_INT8_MIN_ROWS
BLOCK_BYTES, QUAD_BYTES = 8 * 128 + 4 * 32 * 4, 128


def avx512_lib():
    if build.resolve_level("quantized")[0] != "avx512":
        pytest.skip(f"gemm.c's panels run at the avx512 level only: {build.kernel_status()}")
    return build._library("avx512")[0]


@pytest.fixture
def set_engine():
    """Set the avx512 library's engine by name for a test; the flags' choice afterwards."""
    lib = avx512_lib()

    def use(name: str):
        if name == "tiles" and not lib.amx_int8_ready:
            pytest.skip(f"no AMX-INT8 here: {build.amx_int8_status()}")
        assert lib.inferpath_amx_int8_use(ENGINES[name]) == 0
        return lib

    yield use
    build._forget_decisions()


def weight_of(qtype, n: int, k: int, seed: int):
    if qtype in R8_TYPES:
        return repack(random_weight(Q.Q4_K if qtype == "Q4_K_R8" else Q.Q6_K, n, k, seed=seed), drop_source=True)
    return random_weight(qtype, n, k, seed=seed)


def matmul(w, x, bias):
    fn = build.native_quant_matmul()
    return ops.run_quant_matmul(fn, x, w.data, kernel_type(w), bias, w.shape[0])


def test_tile_dpbsud_is_the_sdm_sum():
    """C[m][n] += sum_k sum_i s8(A[m][4k + i]) * u8(B[k][4n + i]), int32, at a configured
    shape smaller than the tile (rows 5, K 16) and a full one, on strided operands."""
    fn = build.native_amx_int8("tile_dpbsud")
    if fn is None:
        pytest.skip(build.kernel_status())
    rng = np.random.default_rng(0)
    for rows, k_bytes in [(5, 16), (16, 64), (16, 32)]:
        a = rng.integers(-128, 128, (rows, 80), dtype=np.int8)
        b = rng.integers(0, 256, (k_bytes // 4, 96), dtype=np.uint8)
        c = rng.integers(-1000, 1000, (rows, 16), dtype=np.int32)
        expected = c.astype(np.int64) + (a[:, :k_bytes].astype(np.int64).reshape(rows, k_bytes // 4, 4)[:, :, None, :]
                                         * b[:, :64].astype(np.int64).reshape(k_bytes // 4, 16, 4)[None]).sum((1, 3))
        assert fn(c.ctypes.data, a.ctypes.data, 80, b.ctypes.data, 96, rows, k_bytes) == 0
        assert np.array_equal(c, expected.astype(np.int32))


@pytest.mark.parametrize("qtype", FILE_TYPES, ids=[t.name for t in FILE_TYPES])
def test_the_panel_is_b_tiles_of_the_weights_values(qtype):
    """Read as B tiles (a row per group of four k values, 16 columns x 4 bytes, rows 128
    bytes apart), a packed panel's bytes times its scales plus its mins are the weight's
    dequantized values (Q8_0's bytes offset by 128, which the kernels take off the int32
    sums as 128 times x's block sum: its min is 0, and the value scale * (q - 128))."""
    avx512_lib()
    n, k = 23, 512  # a partial panel
    w = random_weight(qtype, n, k, seed=3)
    panel = np.zeros(k // 32 * BLOCK_BYTES, dtype=np.uint8)
    assert build.native_amx_int8("pack_panel")(int(qtype), w.data.data_ptr(), w.data.shape[1], n, k,
                                               panel.ctypes.data) == 0
    blocks = panel.reshape(k // 32, BLOCK_BYTES)
    quads = blocks[:, :8 * QUAD_BYTES].reshape(k // 32, 8, 2, 16, 4)  # (block, g, tile h, column, e)
    q = quads.transpose(2, 3, 0, 1, 4).reshape(32, k).astype(np.float64)  # (column, k)
    floats = blocks[:, 8 * QUAD_BYTES:].copy().view(np.float32).reshape(k // 32, 4, 32)
    half = (np.arange(k) % 32) // 16
    scale = floats[:, :2].transpose(2, 0, 1)[:, np.arange(k) // 32, half]  # (column, k)
    mins = floats[:, 2:].transpose(2, 0, 1)[:, np.arange(k) // 32, half]
    offset = 128.0 if qtype == Q.Q8_0 else 0.0  # prepared.h's SIGNED8_OFFSET
    values = ((q - offset) * scale + mins)[:n]
    expected = w.dequantize().double().numpy()
    assert np.allclose(values, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    assert not q[n:].any()  # the missing columns are zeros


SHAPES = [(16, 64, 256), (17, 40, 512), (64, 96, 512), (100, 72, 768), (512, 64, 256)]  # (m, n, k)


@pytest.mark.parametrize("engine", ["reference", "tiles"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
@pytest.mark.parametrize("qtype", FILE_TYPES + R8_TYPES, ids=[getattr(t, "name", t) for t in FILE_TYPES + R8_TYPES])
def test_the_engine_equals_the_vnni_gemm_to_the_bit(qtype, shape, engine, set_engine):
    """Every panel through the engine (counted) gives the VNNI tiles' floats exactly: the
    same integer sums (TDPBSUD's are vpdpbusd's), the same float operations in order.
    "tiles" runs only on a CPU with AMX-INT8 that was granted the tile state."""
    m, n, k = shape
    if qtype in R8_TYPES:  # repacked weights reach the GEMM's panels from R8_GEMM_MIN_ROWS rows only
        m = max(m, R8_GEMM_MIN_ROWS)
    w = weight_of(qtype, n, k, seed=m + n)
    x, bias = torch.randn(m, k), (torch.randn(n) if m % 2 else None)
    set_engine("none")
    vnni = matmul(w, x, bias)
    lib = set_engine(engine)
    out = matmul(w, x, bias)
    assert lib.inferpath_amx_int8_panels() == (n + 31) // 32
    assert torch.equal(out, vnni)


def test_fewer_rows_keep_the_vnni_tiles(set_engine):
    lib = set_engine("reference")
    w = weight_of(Q.Q4_0, 64, 256, seed=1)
    matmul(w, torch.randn(MIN_ROWS - 1, 256), None)
    assert lib.inferpath_amx_int8_panels() == 0
    assert lib.inferpath_amx_int8_takes(int(Q.Q4_0), MIN_ROWS) == 1
    assert lib.inferpath_amx_int8_takes(39, MIN_ROWS) == 0  # MXFP4: off the allow-list


@pytest.fixture
def enabled(monkeypatch):
    """INFERPATH_AMX_INT8=1 (the engine is opt-in), the flags' choice afterwards."""
    monkeypatch.setenv("INFERPATH_AMX_INT8", "1")
    yield
    monkeypatch.delenv("INFERPATH_AMX_INT8")
    build._forget_decisions()


def test_the_flags_choose_the_engine(enabled):
    flags = build.AMX_INT8_FLAGS
    assert build.amx_int8_engine_for(frozenset(), frozenset(), False, True) == "none"
    assert build.amx_int8_engine_for(flags, frozenset(), False, True) == "reference"
    assert build.amx_int8_engine_for(flags, flags, True, True) == "tiles"
    assert build.amx_int8_engine_for(flags, flags, False, True) == "none"  # the tile state refused
    assert build.amx_int8_engine_for(flags, flags, True, False) == "none"  # not asked for: the default
    avx512_lib()
    with build.simulated_cpu_flags(remove=build.AMX_INT8_FLAGS):
        assert build.amx_int8_engine() == "none"
        assert "no AMX-INT8" in build.kernel_status()
    with build.simulated_cpu_flags(add=build.AMX_INT8_FLAGS):
        expected = "tiles" if AMX_INT8_HERE else "reference"
        assert build.amx_int8_engine() == expected
        assert "AMX-INT8" in build.kernel_status()
        with ops.recording_dispatch() as log:
            matmul(weight_of(Q.Q8_0, 32, 64, 0), torch.randn(MIN_ROWS, 64), None)
        assert [c.kernel for c in log] == ["quant-amx-int8"]


AMX_INT8_HERE = build.AMX_INT8_FLAGS <= build._probed_cpu_flags()


def test_the_status_names_missing_amx_flags_before_the_switch(monkeypatch):
    """A CPU without AMX-INT8 hears that, not that the engine is off by default (which it
    could not turn on); a CPU with it hears how to turn it on."""
    avx512_lib()
    monkeypatch.delenv("INFERPATH_AMX_INT8", raising=False)
    try:
        with build.simulated_cpu_flags(remove=build.AMX_INT8_FLAGS):
            assert build.amx_int8_status() == "no AMX-INT8: this CPU lacks amx_int8, amx_tile"
        with build.simulated_cpu_flags(add=build.AMX_INT8_FLAGS):
            assert build.amx_int8_status().startswith("no AMX-INT8: off unless INFERPATH_AMX_INT8=1")
    finally:
        build._forget_decisions()


@pytest.mark.parametrize("alias", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_a_real_models_forward_with_amx_int8_equals_its_vnni_forward(alias, enabled):
    """A 40-token prompt through SmolLM2 (Q4_1, Q8_0) and Qwen2.5-Coder (Q5_0, Q8_0, Q4_K,
    Q6_K): with AMX-INT8 flags (simulated here unless the CPU has them: the reference in
    the engine's slot) every GEMM panel takes the engine, and the logits equal those
    without it to the bit."""
    from inferpath.kernels import accelerate
    from inferpath.kernels.quantized import build_quantized_model
    from inferpath.models import resolve_model
    from inferpath.weights import load_checkpoint
    from test_quantized import _teacher_forced_logits

    lib = avx512_lib()
    model = build_quantized_model(load_checkpoint(resolve_model(alias), keep_quantized=True))
    accelerate(model)
    tokens = list(range(100, 140))
    with build.simulated_cpu_flags(remove=build.AMX_INT8_FLAGS):
        vnni = _teacher_forced_logits(model, tokens, fused_rows=len(tokens), fused_head=False)
    with build.simulated_cpu_flags(add=build.AMX_INT8_FLAGS):
        engine = _teacher_forced_logits(model, tokens, fused_rows=len(tokens), fused_head=False)
        assert lib.inferpath_amx_int8_panels() > 0
    assert torch.equal(engine, vnni)
