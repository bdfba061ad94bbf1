"""Prompts of many rows against repacked weights (csrc/quant/gemm.c's panels packed from
r8.h's groups at the avx512 level, r8.c's tiles elsewhere): against the same weights as
laid out in the file (the same GEMM: equal to the bit) and against the gguf package's
dequantized values times x in float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from inferpath.kernels import build, ops
from inferpath.kernels.groups import QuantGroup
from inferpath.kernels.repacked import repack
from test_quantized import isa, random_weight  # noqa: F401 (isa: a fixture)
from test_repacked import R8_TYPES, _matmul, _x

Q = GGMLQuantizationType
R8_GEMM_MIN_ROWS = 17  # csrc/quant/prepared.h: repacked weights take gemm.c's panels from this many rows (past two tiles)
# (output rows, input columns): whole panels of 32, a panel of 4 groups and one of 1 (40), 3 (88)
SHAPES = [(64, 512), (40, 3 * 256), (88, 5 * 256)]


def _close(out: torch.Tensor, expected: torch.Tensor, x: torch.Tensor, values: torch.Tensor) -> bool:
    """Equal up to float32 summation order: within 4e-6 of sum |x| |w| (the integer sums are exact)."""
    scale = x.abs().double() @ values.abs().double().T
    return bool(((out.double() - expected.double()).abs() <= 4e-6 * scale + 1e-5).all())


def _within_x_rounding(out: torch.Tensor, x: torch.Tensor, values: torch.Tensor, bias) -> bool:
    """out is x @ values^T + bias in float32 but for x's int8 rounding: x meets the weights in
    one int8 pass per 32 values (activations.h), each value within half a step (max|x| / 127
    / 2) of x, so each output within that times |w|, + float32 rounding."""
    rows, k = x.shape
    expected = x @ values.T + (0 if bias is None else bias)
    step = x.reshape(rows, k // 32, 32).abs().amax(-1, keepdim=True).expand(rows, k // 32, 32).reshape(rows, k) / 254
    bound = step.double() @ values.abs().double().T * 1.001 + 1e-5 * (x.abs().double() @ values.abs().double().T) + 1e-4
    return bool(((out.double() - expected.double()).abs() <= bound).all())


def _gemm_runs(level: str) -> bool:
    """Whether gemm.c's kernel is built at ``level`` (AVX-512 VNNI, the avx512 level)."""
    return level == "avx512"


@pytest.mark.parametrize("rows", [R8_GEMM_MIN_ROWS, 37, 64, 512])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("qtype", R8_TYPES, ids=[t.name for t in R8_TYPES])
def test_repacked_prompts_equal_the_files_layout(qtype, shape, rows, isa):
    """Where the GEMM runs, its panels packed from the groups hold the very bytes and floats
    the file's blocks give: the outputs are the as-laid-out GEMM's to the bit. Everywhere,
    they are the gguf package's values times x in float32, up to x's int8 rounding."""
    n, k = shape
    weight = random_weight(qtype, n, k, seed=rows + n + int(qtype))
    packed = repack(weight, drop_source=False)
    x = _x(rows, k, rows + 1)
    bias = torch.randn(n)
    laid_out, repacked = _matmul(x, weight, bias), _matmul(x, packed, bias)
    if _gemm_runs(isa):
        assert torch.equal(repacked, laid_out)
    values = torch.from_numpy(quants.dequantize(weight.data.numpy(), qtype).astype(np.float32)).reshape(n, k)
    assert _within_x_rounding(repacked, x, values, bias)


@pytest.mark.parametrize("rows", [R8_GEMM_MIN_ROWS - 1, R8_GEMM_MIN_ROWS])
def test_the_kernel_switches_at_r8_gemm_min_rows(rows, isa):
    """Below R8_GEMM_MIN_ROWS rows r8.c's tiles serve (the GEMM's float chain for the
    K-quants: test_the_row_tiles_give_the_gemms_bits), from it the GEMM (equal to the file's
    layout)."""
    weight = random_weight(Q.Q4_K, 64, 1024, seed=rows)
    packed = repack(weight, drop_source=False)
    x = _x(rows, 1024, 3)
    laid_out, repacked = _matmul(x, weight), _matmul(x, packed)
    assert _close(repacked, laid_out, x, weight.dequantize())
    if _gemm_runs(isa) and rows >= R8_GEMM_MIN_ROWS:
        assert torch.equal(repacked, laid_out)


def test_a_fused_group_of_repacked_weights_equals_the_files(isa):
    """Q/K/V as one call (outputs side by side, panels split at weight boundaries and chunk
    ends), repacked against as laid out, with biases; 70 and 512 rows (at avx2 the file's
    layout takes dequantized tiles past ops.QUANT_MATMUL_MAX_ROWS, repacked weights r8.c's
    tiles at every row count: both then against float32)."""
    shapes = [(Q.Q6_K, 96), (Q.Q4_K, 24), (Q.Q4_K, 40)]
    files = [random_weight(t, n, 512, seed=i) for i, (t, n) in enumerate(shapes)]
    biases = [torch.randn(96), torch.randn(24), None]
    laid_out = QuantGroup(build.native_quant_matmul_group(), files, biases)
    repacked = QuantGroup(build.native_quant_matmul_group(), [repack(w, drop_source=False) for w in files], biases)
    for rows in (70, 512):
        x = _x(rows, 512, rows)
        expected, out = laid_out(x), repacked(x)
        values = torch.cat([w.dequantize() for w in files])
        if _gemm_runs(isa):
            assert torch.equal(out, expected), rows
        elif ops.quant_rows_fused(rows):  # else the file's layout takes dequantized tiles and a float GEMM
            assert _close(out, expected, x, values), rows
        bias = torch.cat([b if b is not None else torch.zeros(40) for b in biases])
        assert _within_x_rounding(out, x, values, bias), rows


def test_a_repacked_weight_after_an_odd_one_starts_mid_group(isa):
    """A repacked weight whose first output column is not a multiple of 8 in the call (a Q5_0
    weight of 13 rows before it): the panels meet groups mid-way, and r8.c's kernel serves
    those columns instead (close to the file's layout, not to the bit)."""
    w1 = random_weight(Q.Q5_0, 13, 512, seed=1)
    w2 = random_weight(Q.Q4_K, 64, 512, seed=2)
    x = _x(40, 512, 5)
    laid_out = QuantGroup(build.native_quant_matmul_group(), [w1, w2], [None, None])(x)
    out = QuantGroup(build.native_quant_matmul_group(), [w1, repack(w2, drop_source=False)], [None, None])(x)
    assert torch.equal(out[:, :13], laid_out[:, :13])
    assert _close(out, laid_out, x, torch.cat([w1.dequantize(), w2.dequantize()]))


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q5_0, Q.Q8_0], ids=lambda t: t.name)
def test_every_gemm_tile_height_gives_the_same_bits(qtype, isa):
    """gemm.c takes 3 rows of x a tile on AMD cores and 6 elsewhere (its speed per core);
    every height 1..6 gives the same bits, as laid out and repacked, for row counts that
    leave short tiles (37, 70). Where no GEMM is built the setter says so (None)."""
    weight = random_weight(qtype, 64, 512, seed=int(qtype))
    packed = repack(weight, drop_source=False)
    if build.set_gemm_tile_rows(0, isa) is None:
        assert not _gemm_runs(isa)
        return
    try:
        for rows in (37, 70):
            x = _x(rows, 512, rows)
            build.set_gemm_tile_rows(1, isa)
            expected = _matmul(x, weight)
            for height in range(2, 7):
                build.set_gemm_tile_rows(height, isa)
                assert torch.equal(_matmul(x, weight), expected), (rows, height)
                assert torch.equal(_matmul(x, packed), expected), (rows, height)
        with pytest.raises(ValueError, match="0..6"):
            build.set_gemm_tile_rows(7, isa)
    finally:
        build.set_gemm_tile_rows(0, isa)


@pytest.mark.parametrize("qtype", R8_TYPES + [Q.Q8_0, Q.Q5_0, Q.Q4_1], ids=lambda t: t.name)
def test_the_row_tiles_give_the_gemms_bits(qtype, isa):
    """gemm.c's panels run each row's float chain in r8.c's order (quant/panel_epilogue.h;
    Q6_K: both half blocks' scale terms, then both min terms), so a row that r8.c's tiles
    compute (under R8_GEMM_MIN_ROWS rows: a prompt's tail after a prefix-cache hit, a
    verification) gets the bits the GEMM gives it in a prompt of 17 rows or more, and a
    prefix hit's logits are the cold prompt's. Q8_0, Q5_0 and Q4_1 repacked (r8_legacy.c,
    r8_pair.c) likewise: Q8_0's 128 offset comes off the GEMM's int32 sums, as off the
    pairs'. (Below avx512 there is no GEMM, and the K-quants meet x in two int8 passes
    there: r8.c's tiles serve every row count alike.)"""
    if not _gemm_runs(isa):
        pytest.skip(f"no GEMM panels at the {isa} level: r8.c's tiles serve every row count")
    n, k = 88, 5 * 256
    weight = random_weight(qtype, n, k, seed=int(qtype) + 7)
    packed = repack(weight, drop_source=False)
    x = _x(R8_GEMM_MIN_ROWS, k, 11)
    gemm = _matmul(x, packed)
    for rows in (1, 5, 8, R8_GEMM_MIN_ROWS - 1):
        assert torch.equal(_matmul(x[:rows], packed), gemm[:rows]), f"{rows} rows"


def skip_unless_tails_meet_x_as_prompts(prompt_rows: int, tail_rows: int) -> None:
    """Below avx512 a prompt of PROMPT_MIN_ROWS (32) rows or more meets the K-quants' x in one
    int8 pass and fewer rows in two (docs/kquant_kernels.md: the choice per level), so a
    prefix hit's tail rounds x otherwise than the cold prompt did, by design."""
    level = build.kernel_level("quantized")
    if build.k_quant_x_passes(level, rows=prompt_rows) != build.k_quant_x_passes(level, rows=tail_rows):
        pytest.skip(f"at the {level} level a {prompt_rows}-row prompt and a {tail_rows}-row tail meet x in "
                    "different int8 passes")


def greedy_twice_with_prefix_caching(engine, prompt) -> tuple:
    """The same greedy request (12 tokens, logprobs) twice on ``engine``: (first, second,
    prompt tokens the second computed), each run's (token ids, logprobs)."""
    from inferpath.sampling.params import SamplingParams

    def run(request_id: str):
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                              logprobs=1))
        done = []
        while engine.has_unfinished_requests():
            done += [o for o in engine.step() if o.finished]
        (out,) = done
        return out.outputs[0].token_ids, out.outputs[0].logprobs

    cold = run("cold")
    before = engine.stats().num_prompt_tokens_computed
    warm = run("warm")
    return cold, warm, engine.stats().num_prompt_tokens_computed - before


def test_a_prefix_cache_hit_gives_the_cold_prompts_bits():
    """The packaged Qwen2.5-Coder-0.5B (Q5_0, Q8_0, Q4_K, Q6_K), greedy, the same request
    twice with prefix caching: the second computes a 2-row tail past its cached blocks (r8's
    tiles where the cold prompt's 34 rows took the GEMM), and its tokens and logprobs are
    the first's to the bit (tests/test_quantized_1_5b.py: the 1.5B K-quant file, 12 rows)."""
    from inferpath.config import EngineConfig
    from inferpath.engine.llm_engine import LLMEngine
    from inferpath.models import resolve_model

    if build.native_quant_matmul() is None:
        pytest.skip(f"no native kernel here: {build.kernel_status()}")
    skip_unless_tails_meet_x_as_prompts(34, 2)
    engine = LLMEngine.from_model(resolve_model("qwen2.5-coder-0.5b-instruct"),
                                  EngineConfig(threads=2, enable_prefix_caching=True, kv_cache_memory_bytes=32 * 2**20))
    prompt = ("Write a Python function that parses a CSV file with a header row and returns a list of "
              "dictionaries, one per row, converting numeric fields to numbers. Explain each step.")
    cold, warm, computed = greedy_twice_with_prefix_caching(engine, prompt)
    assert 0 < computed < R8_GEMM_MIN_ROWS
    assert warm == cold
