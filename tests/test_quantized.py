"""Quantized GGUF weights read in place (kernels/csrc/quant, kernels/quantized.py).

Each block format's kernels against the ``gguf`` package's dequantizer followed by a
float32 matmul, at every instruction-set level this CPU executes. The fused kernel
quantizes x per 32 values to int8 (scale d = max|x| / 127, each value off by at most d/2;
the 32-value formats carry the residual in a second int8 pass, the K-quants at the avx512
level do not, below it they do: activations.h),
so its error bound per output is sum over blocks of d/2 * sum |w| over the block, plus
float32 rounding. Then the real models: quantized against the same file dequantized to
float32 by inferpath, teacher-forced over 512+ tokens of text.
"""

from __future__ import annotations

import argparse
import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from inferpath.kernels import build, ops, quant_ops
from inferpath.kernels.groups import QuantGroup
from inferpath.kernels.quantized import QuantEmbedding, QuantLinear
from inferpath.model.batch_invariant import row_invariant_dispatch
from inferpath.weights.quantized import QUANTIZED_TYPES, QuantizedTensor

Q = GGMLQuantizationType
TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]
ROWS = [1, 3, 8, 13, 64]  # the row kernel; the wide kernel (tiles of 8); GEMM panels (avx512) or tiles and a tail


@pytest.fixture(params=build.LEVEL_NAMES)
def isa(request, monkeypatch):
    level = request.param
    if not build.can_run(level):
        pytest.skip(f"this CPU cannot execute the {level} level (its best is {build.cpu_level()})")
    monkeypatch.setenv("INFERPATH_ISA", level)
    built, reason = build.resolve_level("quantized", level)
    if built is None:
        pytest.skip(f"no native kernel here: {reason}")
    assert built == level, f"the {level} kernels did not build: {reason}"
    return level


def random_weight(qtype: GGMLQuantizationType, rows: int, cols: int, seed: int) -> QuantizedTensor:
    """Blocks of ``qtype``: quantized random floats where the gguf package quantizes the
    format, else random bytes (every bit pattern of the quants and 6-bit scales) with
    small positive float16 scales."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
        data = quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    else:
        data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
        scale_at = {Q.Q6_K: [208]}.get(qtype, [0, 2])  # byte offsets of the float16 d (and dmin)
        for at in scale_at:
            halves = rng.uniform(0.002, 0.02, (rows, cols // block)).astype(np.float16)
            data[:, :, at:at + 2] = halves.view(np.uint8).reshape(rows, cols // block, 2)
        data = data.reshape(rows, -1)
    return QuantizedTensor(torch.from_numpy(np.ascontiguousarray(data)), qtype, (rows, cols))


def activation_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(m, n) bound on |fused - exact| from rounding x to int8 per 32 values."""
    m, k = x.shape
    half_step = x.reshape(m, k // 32, 32).abs().amax(-1) / 127 / 2  # (m, blocks)
    w_abs = w.abs().reshape(w.shape[0], k // 32, 32).sum(-1)  # (n, blocks)
    return half_step @ w_abs.T


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_dequantize_equals_the_gguf_package(qtype, isa):
    block = GGML_QUANT_SIZES[qtype][0]
    weight = random_weight(qtype, 7, 3 * block if block == 256 else 7 * block, seed=int(qtype))
    ours = ops.run_dequantize(build.native_quant_dequantize(), weight.data, int(qtype), weight.shape[1])
    assert torch.equal(ours, weight.dequantize())


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_quantized_matmul_within_the_activation_rounding(qtype, rows, isa):
    """Odd output counts, block counts that are not powers of two; the fused kernel at
    every row count, and the module's dispatch (fused or dequantized tile) too."""
    block = GGML_QUANT_SIZES[qtype][0]
    cols = 3 * block if block == 256 else 9 * block
    weight = random_weight(qtype, 37, cols, seed=rows + int(qtype))
    exact_w = weight.dequantize()  # (37, cols) the gguf package's values
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 4
    bias = torch.randn(37, generator=gen)
    exact = x @ exact_w.T + bias
    bound = activation_bound(x, exact_w) + 1e-4 * (x.abs() @ exact_w.abs().T) + 1e-5
    fused = ops.run_quant_matmul(build.native_quant_matmul(), x, weight.data, int(qtype), bias, 37)
    assert ((fused - exact).abs() <= bound).all(), (fused - exact).abs().max()
    assert (fused - exact).abs().max() > 0 or rows == 0  # the kernel does quantize x
    module = QuantLinear(weight, bias.clone())
    out = module(x)
    assert out.shape == (rows, 37) and ((out - exact).abs() <= bound).all()
    if not ops.quant_rows_fused(rows):  # dequantized tiles: float32 rounding only
        torch.testing.assert_close(out, exact, rtol=1e-4, atol=1e-4)


def one_pass_x(x: torch.Tensor) -> torch.Tensor:
    """x as the K-quant kernels see it (activations.h): per 32 values d = max|x| / 127 and
    q = round(x * 127 / max|x|) (ties to even, as the kernels round), x' = d * q."""
    v, amax = _scaled_blocks(x)
    return (torch.round(v) * (amax / 127.0)).reshape(x.shape)


def _scaled_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x per 32 values times 127 / max|x| (float32, as the kernels), and max|x| per block."""
    m, k = x.shape
    blocks = x.reshape(m, k // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    inv = torch.where(inv.isinf(), torch.zeros_like(inv), inv)  # a subnormal block: q = 0
    return blocks * inv, amax


def two_pass_x(x: torch.Tensor) -> torch.Tensor:
    """x in two int8 passes (activations.h): q as one pass, then the residual x / d - q in
    steps of 1/256, rounded (ties to even) and clipped to +-127: x' = d (q + r / 256)."""
    v, amax = _scaled_blocks(x)
    whole = torch.round(v)
    rest = torch.round((v - whole) * 256.0).clamp(-127, 127)
    return ((whole.double() + rest.double() / 256.0) * (amax.double() / 127.0)).reshape(x.shape)


def k_quant_passes(x: torch.Tensor, level: str | None = None, rows_alone: bool = False) -> int:
    """The int8 passes the K-quant kernels at ``level`` (the active one) meet x in: a call of
    x's rows (a prompt-sized one has its own count: activations.h)."""
    return build.k_quant_x_passes(level, rows=x.shape[0], rows_alone=rows_alone)


def k_quant_x(x: torch.Tensor, level: str | None = None, rows_alone: bool = False) -> torch.Tensor:
    """x as the K-quant kernels at ``level`` (the active one) meet it: their pass count."""
    return one_pass_x(x) if k_quant_passes(x, level, rows_alone) == 1 else two_pass_x(x)


def k_quant_tolerance(x: torch.Tensor, exact_w: torch.Tensor, level: str | None = None,
                      rows_alone: bool = False) -> torch.Tensor:
    """(m, n) |kernel - k_quant_x(x) @ w.T| allowed: float32 rounding (2e-6 of sum |x| |w|);
    with two passes also a residual step (d / 256) on two values a block, where a value sits
    on a rounding tie of its residual that the kernels (x * inv - q contracted into one
    rounding at some levels) and this model break apart."""
    xd, wd = x.double(), exact_w.double()
    tolerance = 2e-6 * (xd.abs() @ wd.abs().T) + 1e-6
    if k_quant_passes(x, level, rows_alone) == 2:
        m, k = x.shape
        step = xd.reshape(m, k // 32, 32).abs().amax(-1) / 127 / 256
        tolerance = tolerance + 2 * step @ wd.abs().reshape(wd.shape[0], k // 32, 32).amax(-1).T
    return tolerance


def kernel_levels() -> list[str]:
    """The levels whose quantized kernels this CPU runs."""
    return [level for level in build.LEVEL_NAMES
            if build.can_run(level) and build.resolve_level("quantized", level)[0] == level]


@contextlib.contextmanager
def k_quant_x_passes_everywhere(passes: int):
    """Every level's K-quant kernels meeting x in ``passes`` int8 passes (their defaults
    differ: activations.h), restored after: for tests that hold two levels to the same bits."""
    levels = kernel_levels()
    before = {level: (build.k_quant_x_passes(level), build.k_quant_x_passes(level, rows=build.k_quant_prompt_min_rows(level)))
              for level in levels}
    try:
        for level in levels:
            build.set_k_quant_x_passes(passes, level)
        yield
    finally:
        for level, (decode, prompt) in before.items():
            build.set_k_quant_x_passes(decode, level, prompt=prompt)


K_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]


def test_each_level_says_how_many_passes_of_x_its_k_quants_meet():
    """A decode step's rows: one at avx512 (VNNI: the second pass doubles the
    instruction-bound row kernel's work), two below (one put the 1.5B file under 99%
    agreement at avx2); a prompt-sized call (from k_quant_prompt_min_rows() rows, not
    rows_alone): one everywhere. Settable, 1 or 2 only, both counts restored."""
    for level in kernel_levels():
        first = build.k_quant_prompt_min_rows(level)
        assert first == 32, level
        assert build.k_quant_x_passes(level) == build.k_quant_x_passes(level, rows=first - 1) \
            == build.k_quant_x_passes(level, rows=512, rows_alone=True) == (1 if level == "avx512" else 2), level
        assert build.k_quant_x_passes(level, rows=first) == build.k_quant_x_passes(level, rows=512) == 1, level
    level = kernel_levels()[0]
    with k_quant_x_passes_everywhere(2):
        assert build.k_quant_x_passes(level) == build.k_quant_x_passes(level, rows=512) == 2
        build.set_k_quant_x_passes(1, level, prompt=2)
        assert (build.k_quant_x_passes(level), build.k_quant_x_passes(level, rows=512)) == (1, 2)
        with pytest.raises(ValueError, match="must be 1 or 2, got 3"):
            build.set_k_quant_x_passes(3, level)
        with pytest.raises(ValueError, match="must be 1 or 2, got 0"):
            build.set_k_quant_x_passes(1, level, prompt=0)
    assert build.k_quant_x_passes(level) == (1 if level == "avx512" else 2)
    assert build.k_quant_x_passes(level, rows=512) == 1


@pytest.mark.parametrize("rows_alone", [False, True], ids=["together", "alone"])
@pytest.mark.parametrize("qtype", K_TYPES, ids=[t.name for t in K_TYPES])
def test_a_prompt_sized_call_meets_x_in_its_own_passes(qtype, rows_alone, isa):
    """At each level's defaults, 64 rows of x together meet the K-quants in one int8 pass and
    64 rows alone (--deterministic) in the decode count: each within float32 rounding of
    that many passes and far from the other."""
    from inferpath.model.batch_invariant import row_invariant_dispatch

    cols = 3 * 256
    weight = random_weight(qtype, 16, cols, seed=7 + int(qtype))
    exact_w = weight.dequantize().double()
    x = torch.randn(64, cols, generator=torch.Generator().manual_seed(3)) * 3
    passes = k_quant_passes(x, rows_alone=rows_alone)
    assert passes == (build.k_quant_x_passes() if rows_alone else 1)
    with row_invariant_dispatch(rows_alone):
        fused = ops.run_quant_matmul(build.native_quant_matmul(), x, weight.data, int(qtype), None, 16).double()
    tolerance = k_quant_tolerance(x, exact_w, rows_alone=rows_alone)
    assert ((fused - k_quant_x(x, rows_alone=rows_alone).double() @ exact_w.T).abs() <= tolerance).all()
    other = (two_pass_x(x) if passes == 1 else one_pass_x(x)).double() @ exact_w.T
    assert not ((fused - other).abs() <= tolerance).all()


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("rows", [1, 3, 8, 64, 512])
@pytest.mark.parametrize("qtype", K_TYPES, ids=[t.name for t in K_TYPES])
def test_k_quants_meet_x_in_the_passes_they_say(qtype, rows, passes, isa):
    """The K-quants' arithmetic, at every level and row count (row kernel, wide tiles, GEMM
    panels), in one pass and in two: the dequantized weights against x rounded to that many
    int8 passes per 32 values, exactly up to float32 rounding (the integer sums are exact).
    The other pass count lands ~d/2 per value away: far outside this tolerance."""
    cols = 5 * 256
    weight = random_weight(qtype, 19, cols, seed=rows + 3 * int(qtype))
    exact_w = weight.dequantize().double()
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 4
    with k_quant_x_passes_everywhere(passes):
        expected = k_quant_x(x).double() @ exact_w.T
        fused = ops.run_quant_matmul(build.native_quant_matmul(), x, weight.data, int(qtype), None, 19).double()
        tolerance = k_quant_tolerance(x, exact_w)
    assert ((fused - expected).abs() <= tolerance).all(), ((fused - expected).abs() / tolerance).max()
    other = (two_pass_x(x) if passes == 1 else one_pass_x(x)).double() @ exact_w.T
    assert not ((fused - other).abs() <= tolerance).all()


@pytest.mark.parametrize("rows", [1, 8, 64])
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0], ids=["Q4_K", "Q8_0"])
def test_a_block_of_subnormal_activations_counts_as_zeros(qtype, rows, isa):
    """A 32-value block of x whose largest value is subnormal (127 / max|x| overflows):
    quantized to zeros at every level (activations.h), not an int8 of an infinite product
    (undefined in C: the portable level and the SIMD ones disagreed). The other blocks of
    the row are as before."""
    cols = 256
    weight = random_weight(qtype, 16, cols, seed=7)
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows))
    x[:, 32:64] = torch.full((rows, 32), 1e-39) * torch.randn(rows, 32).sign()  # subnormal float32
    x[0, :32], x[0, 64:] = 0, 0  # row 0: that block alone (its output exactly zero)
    exact_w = weight.dequantize().double()
    cleared = x.clone()
    cleared[:, 32:64] = 0
    fused = ops.run_quant_matmul(build.native_quant_matmul(), x, weight.data, int(qtype), None, 16)
    zeroed = ops.run_quant_matmul(build.native_quant_matmul(), cleared, weight.data, int(qtype), None, 16)
    assert torch.isfinite(fused).all() and not fused[0].any()
    assert torch.equal(fused, zeroed)
    # within x's int8 rounding (each value off by at most max|x| / 254 of its block)
    scale = cleared.abs().double() @ exact_w.abs().T
    assert ((fused.double() - cleared.double() @ exact_w.T).abs() <= scale / 254 + 1e-4).all()


def test_tiles_cover_every_row(monkeypatch):
    """Many rows through several dequantized tiles (a tile smaller than the weight)."""
    monkeypatch.setattr(quant_ops, "DEQUANT_TILE_VALUES", 5 * 64)
    monkeypatch.setattr(quant_ops, "QUANT_MATMUL_MAX_ROWS", dict.fromkeys(quant_ops.QUANT_MATMUL_MAX_ROWS, 8))
    weight = random_weight(Q.Q4_1, 23, 64, seed=1)
    x = torch.randn(40, 64)
    torch.testing.assert_close(QuantLinear(weight)(x), x @ weight.dequantize().T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_0], ids=["Q8_0", "Q5_0"])
def test_embedding_rows_are_the_dequantized_rows(qtype, isa):
    weight = random_weight(qtype, 50, 96, seed=5)
    ids = torch.tensor([3, 0, 49, 3])
    out = QuantEmbedding(weight)(ids)
    assert torch.equal(out, weight.dequantize()[ids])
    assert QuantEmbedding(weight, torch.bfloat16)(ids).dtype == torch.bfloat16


def test_bad_shapes_are_refused():
    if build.native_quant_matmul() is None:
        pytest.skip(f"no native kernel here: {build.kernel_status()}")
    weight = random_weight(Q.Q4_0, 4, 64, seed=0)
    with pytest.raises(RuntimeError, match="quantized matmul rejected"):
        ops.run_quant_matmul(build.native_quant_matmul(), torch.randn(1, 48), weight.data, int(Q.Q4_0), None, 4)


def _teacher_forced_logits(model, tokens: list[int], fused_rows: int | None = None,
                           fused_head: bool = True, rows_alone: bool = False) -> torch.Tensor:
    """One pass over ``tokens`` (one sequence), logits of every position: (len, vocab).
    Up to ``fused_rows`` rows take the fused kernels (the LM head's only if ``fused_head``);
    ``rows_alone``: each row by itself (the row kernel, what a decode step runs)."""
    from inferpath.cache.kv import KVCache
    from inferpath.model import AttentionMetadata
    from inferpath.model.batch_invariant import row_invariant_dispatch

    num_blocks = (len(tokens) + 15) // 16
    cache = KVCache(model.config, num_blocks, 16, torch.float32)
    meta = AttentionMetadata(slot_mapping=torch.arange(len(tokens)), query_start_loc=torch.tensor([0, len(tokens)]),
                             seq_lens=torch.tensor([len(tokens)]), block_tables=torch.arange(num_blocks)[None, :],
                             query_lens=[len(tokens)], seq_lens_list=[len(tokens)], block_size=16)
    default = quant_ops.QUANT_MATMUL_MAX_ROWS
    try:
        if fused_rows is not None:
            quant_ops.QUANT_MATMUL_MAX_ROWS = dict.fromkeys(default, fused_rows)
        with torch.inference_mode(), row_invariant_dispatch(rows_alone):
            hidden = model(torch.tensor(tokens), torch.arange(len(tokens)), cache, meta)
        if not fused_head:
            quant_ops.QUANT_MATMUL_MAX_ROWS = default
        with torch.inference_mode(), row_invariant_dispatch(rows_alone and fused_head):
            return model.compute_logits(hidden)
    finally:
        quant_ops.QUANT_MATMUL_MAX_ROWS = default


@pytest.mark.parametrize("rows_alone,repacked", [(False, False), (True, False), (True, True)],
                         ids=["rows-together", "rows-alone", "rows-alone-repacked"])
@pytest.mark.parametrize("alias,fused_head", [("smollm2-135m-instruct", True), ("qwen2.5-coder-0.5b-instruct", False)])
def test_real_model_quantized_agrees_with_its_dequantized_self(alias, fused_head, rows_alone, repacked):
    """SmolLM2 (Q4_1 + a Q8_0 embedding and tied head) and Qwen2.5-Coder (Q5_0, Q8_0, Q4_K,
    Q6_K; an untied Q8_0 head): the quantized path against the same file dequantized to
    float32, teacher-forced over 520 tokens of text: top-1 agreement >= 99%, perplexity
    within 1%. Every row goes through the fused int8 kernels: the 520 rows together (what a
    prompt runs: gemm.c's panels at the avx512 level, the wide kernel below it), or each
    row alone (the row kernel: what a decode step runs). SmolLM2's LM head included;
    Qwen's 151,936-row head (Q8_0, as SmolLM2's) takes the dequantized tile for time.
    ``repacked``: its Q4_K and Q6_K linears repacked by 8 rows (kernels/repacked.py; SmolLM2
    has none: the same run)."""
    from inferpath.kernels import accelerate
    from inferpath.kernels.quantized import build_quantized_model
    from inferpath.model import build_model
    from inferpath.models import resolve_model
    from inferpath.tokenizer import load_tokenizer
    from inferpath.weights import load_checkpoint

    if build.native_quant_matmul() is None:
        pytest.skip(f"no native kernel here: {build.kernel_status()}")
    path = resolve_model(alias)
    tokens = load_tokenizer(path).encode(argparse.__doc__)[:520]
    assert len(tokens) == 520
    checkpoint = load_checkpoint(path, keep_quantized=True)
    kinds = {t.type_name for t in checkpoint.quantized_tensors.values()}
    assert kinds == {"smollm2-135m-instruct": {"Q4_1", "Q8_0"}, "qwen2.5-coder-0.5b-instruct": {"Q5_0", "Q8_0", "Q4_K", "Q6_K"},
                     "qwen2.5-coder-1.5b-instruct": {"Q4_K", "Q6_K"}}[alias]  # (test_quantized_1_5b.py)
    quantized = build_quantized_model(checkpoint, repack_formats=("Q4_K", "Q6_K") if repacked else ())
    accelerate(quantized)
    assert isinstance(quantized.lm_head, QuantLinear)
    packed = [m for m in quantized.modules() if isinstance(m, QuantLinear) and getattr(m.qweight, "repacked", False)]
    assert bool(packed) == (repacked and alias != "smollm2-135m-instruct"), len(packed)
    fused = _teacher_forced_logits(quantized, tokens, fused_rows=len(tokens), fused_head=fused_head,
                                   rows_alone=rows_alone)
    del quantized, checkpoint
    plain = build_model(load_checkpoint(path))
    accelerate(plain)
    reference = _teacher_forced_logits(plain, tokens)
    agreement = (fused.argmax(-1) == reference.argmax(-1)).float().mean().item()
    targets = torch.tensor(tokens[1:])
    ppl_fused = F.cross_entropy(fused[:-1], targets).exp().item()
    ppl_reference = F.cross_entropy(reference[:-1], targets).exp().item()
    assert agreement >= 0.99, agreement
    assert abs(ppl_fused / ppl_reference - 1) <= 0.01, (ppl_fused, ppl_reference)


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_gemm_panels_are_the_row_kernel_up_to_summation_order(qtype, isa):
    """Many rows together (gemm.c's packed panels at the avx512 level, the wide kernel
    below) against each row alone through the row kernel: the same integer sums and
    scales, so only float32 summation order differs. Row counts that leave partial row
    tiles (3 rows a tile), output counts that leave partial panels (32 columns), a group
    whose weights split panels, biases."""
    if build.native_quant_matmul() is None:
        pytest.skip(f"no native kernel here: {build.kernel_status()}")
    block = GGML_QUANT_SIZES[qtype][0]
    cols = 2 * block if block == 256 else 11 * block
    weights = [random_weight(qtype, 45, cols, seed=7), random_weight(Q.Q4_1, 21, cols, seed=8)]
    biases = [torch.randn(45), None]
    group = QuantGroup(build.native_quant_matmul_group(), weights, biases)
    for rows in [r for r in (10, 17, 71) if ops.quant_rows_fused(r)]:  # the generic level tiles 71
        x = torch.randn(rows, cols) * 3
        together = group(x)
        with row_invariant_dispatch():
            alone = group(x)
        scale = alone.abs().amax()
        torch.testing.assert_close(together, alone, rtol=0, atol=float(scale) * 2e-6)


@pytest.mark.parametrize("rows", [1, 5, 11])
def test_a_group_of_weights_is_their_matmuls_side_by_side(rows, isa):
    """Q/K/V of different formats and sizes, with biases, as one call: each weight's
    columns are exactly its own matmul (the same per-row arithmetic)."""
    weights = [random_weight(Q.Q5_0, 64, 96, seed=1), random_weight(Q.Q8_0, 32, 96, seed=2),
               random_weight(Q.Q4_1, 33, 96, seed=3)]
    biases = [torch.randn(64), None, torch.randn(33)]
    group = QuantGroup(build.native_quant_matmul_group(), weights, biases)
    x = torch.randn(rows, 96)
    expected = torch.cat([ops.run_quant_matmul(build.native_quant_matmul(), x, w.data, int(w.qtype), b, w.shape[0])
                          for w, b in zip(weights, biases)], dim=1)
    assert torch.equal(group(x), expected)


@pytest.mark.parametrize("tile_rows", [7, 40, 1000])
def test_a_group_past_the_fused_rows_is_one_gemm_per_dequantized_tile(tile_rows, monkeypatch):
    """More rows than the fused kernels take: the group's weights dequantized (exactly, as
    the gguf package does) into tiles that may span two weights, each tile one GEMM, biases
    where each weight has one: the float32 matmul of the dequantized weights."""
    if build.native_quant_matmul() is None:
        pytest.skip(f"no native kernel here: {build.kernel_status()}")
    weights = [random_weight(Q.Q5_0, 64, 96, seed=1), random_weight(Q.Q8_0, 32, 96, seed=2),
               random_weight(Q.Q4_1, 33, 96, seed=3)]
    biases = [torch.randn(64), None, torch.randn(33)]
    group = QuantGroup(build.native_quant_matmul_group(), weights, biases)
    monkeypatch.setattr(quant_ops, "QUANT_MATMUL_MAX_ROWS", dict.fromkeys(quant_ops.QUANT_MATMUL_MAX_ROWS, 4))
    monkeypatch.setattr(quant_ops, "DEQUANT_TILE_VALUES", tile_rows * 96)
    x = torch.randn(9, 96)
    dense = torch.cat([w.dequantize() for w in weights])  # the gguf package's values
    bias = torch.cat([torch.zeros(w.shape[0]) if b is None else b for w, b in zip(weights, biases)])
    torch.testing.assert_close(group(x), torch.nn.functional.linear(x, dense, bias), rtol=1e-5, atol=1e-4)
