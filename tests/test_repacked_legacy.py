"""Q8_0, Q5_0 and Q4_1 repacked into groups of eight rows (kernels/repacked.py,
csrc/quant/r8_legacy.c) against the gguf package's dequantized weights, the file's layout,
across levels, and row by row."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from inferpath.kernels import build, ops
from inferpath.kernels.groups import QuantGroup
from inferpath.kernels.repacked import ROW_BYTES, kernel_type, repack, repackable
from inferpath.model.batch_invariant import row_invariant_dispatch
from test_quantized import activation_bound, isa, k_quant_x_passes_everywhere, random_weight  # noqa: F401 (isa: a fixture)

Q = GGMLQuantizationType
LEGACY = [Q.Q8_0, Q.Q5_0, Q.Q4_1]
IDS = [t.name for t in LEGACY]
ROWS = [1, 3, 5, 8, 13, 64, 512]


def _matmul(x: torch.Tensor, weight, bias=None, level=None) -> torch.Tensor:
    return ops.run_quant_matmul(build.native_quant_matmul(level), x, weight.data, kernel_type(weight), bias,
                                weight.shape[0])


def _x(rows: int, cols: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 4


@pytest.mark.parametrize("qtype", LEGACY, ids=IDS)
def test_repacked_values_are_the_files_to_the_bit_in_the_files_bytes(qtype, isa):
    weight = random_weight(qtype, 24, 7 * 32, seed=int(qtype))
    packed = repack(weight, drop_source=False)
    assert packed.data.shape == weight.data.shape == (24, 7 * ROW_BYTES[qtype])  # no bytes added
    assert torch.equal(packed.dequantize(), weight.dequantize())


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("qtype", LEGACY, ids=IDS)
def test_repacked_within_the_activation_rounding(qtype, rows, isa):
    """x in two int8 passes (activations.h): within 1/256 of one pass's rounding bound,
    and equal to the file's layout up to float32 summation order (odd block counts)."""
    cols = 9 * 32
    weight = random_weight(qtype, 40, cols, seed=rows + int(qtype))
    packed = repack(weight, drop_source=False)
    exact_w = weight.dequantize()
    x = _x(rows, cols, rows)
    bias = torch.randn(40)
    scale = x.abs() @ exact_w.abs().T + bias.abs()
    fused = _matmul(x, packed, bias)
    bound = activation_bound(x, exact_w) / 128 + 1e-5 * scale + 1e-5
    assert ((fused - (x @ exact_w.T + bias)).abs() <= bound).all()
    assert ((fused - _matmul(x, weight, bias)).abs() <= 2e-6 * scale + 1e-6).all()


@pytest.mark.parametrize("qtype", LEGACY, ids=IDS)
def test_every_level_gives_the_same_bits(qtype):
    """The SIMD kernels and the portable spec run one float chain per row, on the same
    exact integers (Q8_0: |w| against x carrying w's sign at every level): equal to the bit,
    at 1, 5 and 64 rows (row by row: the GEMM's panels are avx512's alone)."""
    weight = random_weight(qtype, 16, 11 * 32, seed=7)
    packed = repack(weight, drop_source=False)
    for rows in (1, 5, 64):
        x = _x(rows, 11 * 32, rows)
        with row_invariant_dispatch():
            outs = {level: _matmul(x, packed, level=level) for level in build.LEVEL_NAMES
                    if build.can_run(level) and build.resolve_level("quantized", level)[0] == level}
        assert len(outs) >= 1
        first = next(iter(outs.values()))
        for level, out in outs.items():
            assert torch.equal(out, first), (level, rows)


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("qtype", LEGACY, ids=IDS)
def test_tiles_of_rows_give_every_levels_bits(qtype, passes):
    """A verification's tiles (2-8 rows of x at once) over pairs of groups: at avx512
    r8_pair.c's 512-bit kernel (two groups per vector), elsewhere r8_legacy.c's; the same
    chain per row and lane, so every level gives the same bits, x in one int8 pass or two
    (an odd group at the end: the single-group kernel beside the pairs)."""
    weight = repack(random_weight(qtype, 40, 9 * 32, seed=5), drop_source=False)
    with k_quant_x_passes_everywhere(passes):
        for rows in range(2, 9):  # r8_pair.c interleaves every row's chains at 3-6 rows, not at 2, 7, 8
            x = _x(rows, 9 * 32, 30 + rows)
            outs = {level: _matmul(x, weight, level=level) for level in build.LEVEL_NAMES
                    if build.can_run(level) and build.resolve_level("quantized", level)[0] == level}
            first = next(iter(outs.values()))
            for level, out in outs.items():
                assert torch.equal(out, first), (level, rows)


@pytest.mark.parametrize("qtype", LEGACY, ids=IDS)
def test_a_row_alone_equals_the_same_row_in_a_tile(qtype, isa):
    weight = repack(random_weight(qtype, 32, 8 * 32, seed=11), drop_source=False)
    x = _x(13, 8 * 32, 2)
    with row_invariant_dispatch():
        tile = _matmul(x, weight)
    for j in (0, 4, 12):
        assert torch.equal(_matmul(x[j:j + 1].contiguous(), weight), tile[j:j + 1])
    assert torch.equal(_matmul(x[:5].contiguous(), weight), tile[:5])


@pytest.mark.parametrize("rows", [17, 64, 512])  # from R8_GEMM_MIN_ROWS (csrc/quant/prepared.h): the GEMM's rows
@pytest.mark.parametrize("qtype", LEGACY, ids=IDS)
def test_the_gemm_from_repacked_groups_is_the_files_gemm_to_the_bit(qtype, rows):
    """avx512: gemm.c's panels packed from the groups (r8_legacy_pack) hold the file's
    panel bytes and floats; 17+ rows (R8_GEMM_MIN_ROWS), odd output counts in the last panel (40 = 32 + 8)."""
    if not build.can_run("avx512") or build.resolve_level("quantized", "avx512")[0] != "avx512":
        pytest.skip("gemm.c's panels run at avx512 only")
    weight = random_weight(qtype, 40, 9 * 32, seed=rows)
    packed = repack(weight, drop_source=False)
    x = _x(rows, 9 * 32, rows)
    bias = torch.randn(40)
    assert torch.equal(_matmul(x, packed, bias, "avx512"), _matmul(x, weight, bias, "avx512"))


def test_a_qkv_group_of_repacked_q5_0_and_q8_0_with_k_quants(isa):
    """The 0.5B file's Q/K/V (Q5_0, Q5_0, Q8_0) repacked side by side, with a Q6_K repacked
    and a Q4_0 as laid out: x in two passes for all, columns split by the group call."""
    weights = [repack(random_weight(Q.Q5_0, 24, 512, seed=1), drop_source=False),
               repack(random_weight(Q.Q8_0, 16, 512, seed=2), drop_source=False),
               repack(random_weight(Q.Q6_K, 8, 512, seed=3), drop_source=False),
               random_weight(Q.Q4_0, 13, 512, seed=4)]
    biases = [torch.randn(24), None, torch.randn(8), None]
    group = QuantGroup(build.native_quant_matmul_group(), weights, biases)
    for rows in (1, 6, 70):
        x = _x(rows, 512, rows)
        exact = torch.cat([x @ w.dequantize().T + (0 if b is None else b) for w, b in zip(weights, biases)], 1)
        scale = x.abs() @ torch.cat([w.dequantize() for w in weights]).abs().T
        assert ((group(x) - exact).abs() <= 5e-3 * scale + 1e-4).all(), rows


def test_shapes_that_are_not_whole_groups_stay_as_laid_out():
    assert not repackable(random_weight(Q.Q8_0, 12, 64, seed=0))
    assert repackable(random_weight(Q.Q5_0, 8, 32, seed=0))
    with pytest.raises(ValueError, match="cannot be repacked by 8 rows"):
        repack(random_weight(Q.Q5_0, 20, 64, seed=0))


@pytest.mark.parametrize("rows_alone", [True, False], ids=["rows-alone", "rows-together"])
def test_the_05b_file_with_every_format_repacked_agrees_with_its_dequantized_self(rows_alone):
    """Qwen2.5-Coder-0.5B's Q5_0, Q8_0, Q4_K and Q6_K linears all repacked (its Q8_0 head
    among them), teacher-forced over 520 tokens as test_quantized's check: top-1 agreement
    >= 99%, perplexity within 1% of the file dequantized to float32."""
    import argparse

    import torch.nn.functional as F

    from inferpath.kernels import accelerate
    from inferpath.kernels.quantized import QuantLinear, build_quantized_model
    from inferpath.kernels.repacked import REPACK_FORMATS
    from inferpath.model import build_model
    from inferpath.models import resolve_model
    from inferpath.tokenizer import load_tokenizer
    from inferpath.weights import load_checkpoint
    from test_quantized import _teacher_forced_logits

    if build.native_quant_matmul() is None:
        pytest.skip(f"no native kernel here: {build.kernel_status()}")
    path = resolve_model("qwen2.5-coder-0.5b-instruct")
    tokens = load_tokenizer(path).encode(argparse.__doc__)[:520]
    quantized = build_quantized_model(load_checkpoint(path, keep_quantized=True), repack_formats=REPACK_FORMATS)
    accelerate(quantized)
    packed = {m.qweight.type_name for m in quantized.modules()
              if isinstance(m, QuantLinear) and getattr(m.qweight, "repacked", False)}
    assert packed == {"Q5_0", "Q8_0", "Q4_K", "Q6_K"} and quantized.lm_head.qweight.repacked
    fused = _teacher_forced_logits(quantized, tokens, fused_rows=len(tokens), fused_head=False, rows_alone=rows_alone)
    del quantized
    plain = build_model(load_checkpoint(path))
    accelerate(plain)
    reference = _teacher_forced_logits(plain, tokens)
    agreement = (fused.argmax(-1) == reference.argmax(-1)).float().mean().item()
    targets = torch.tensor(tokens[1:])
    ratio = F.cross_entropy(fused[:-1], targets).exp().item() / F.cross_entropy(reference[:-1], targets).exp().item()
    assert agreement >= 0.99 and abs(ratio - 1) <= 0.01, (agreement, ratio)


@pytest.mark.parametrize("qtype", LEGACY, ids=IDS)
def test_an_embedding_looks_its_rows_up_in_the_repacked_groups(qtype):
    """A table a tied LM head shares is repacked with it: the lookup dequantizes each id's
    group of eight rows and keeps its row, the file's values to the bit (ids in any order,
    repeated, in the first and the last group)."""
    from inferpath.kernels.quantized import QuantEmbedding

    weight = random_weight(qtype, 40, 3 * 32, seed=9)
    ids = torch.tensor([[0, 7, 8, 39], [5, 5, 33, 16]])
    laid_out, packed = QuantEmbedding(weight), QuantEmbedding(repack(weight, drop_source=False))
    assert packed(ids).shape == (2, 4, 3 * 32)
    assert torch.equal(packed(ids), laid_out(ids))
    for i in (0, 13, 39):  # a decode step's one id: its group sliced, not gathered
        one = torch.tensor([i])
        assert torch.equal(packed(one), laid_out(one))
    for bad in (40, -1):
        with pytest.raises(IndexError):
            packed(torch.tensor([bad]))
        with pytest.raises(IndexError):
            packed(torch.tensor([1, bad]))


def test_smollm2s_tied_table_is_repacked_once_for_the_lookup_and_the_head():
    """SmolLM2's Q8_0 embedding is its LM head too: repacked where the plan repacks Q8_0, one
    tensor under both modules (the model's bytes counted once)."""
    from inferpath import LLM
    from inferpath.kernels.quantized import QuantEmbedding, QuantLinear

    llm = LLM("smollm2-135m-instruct", threads=1)
    model = llm.engine.runner.model
    table, head = model.model.embed_tokens, model.lm_head
    assert isinstance(table, QuantEmbedding) and isinstance(head, QuantLinear)
    assert head.qweight is table.qweight
    assert getattr(table.qweight, "repacked", False) == ("Q8_0" in llm.engine.weight_plan.repacked)
    assert llm.engine.weight_format.decode_bytes < 100e6  # the table once (96.6 MB a token)


@pytest.mark.parametrize("repacked", [False, True], ids=["as-laid-out", "repacked"])
def test_a_heads_row_range_is_the_whole_heads_slice(repacked):
    """QuantLinear.forward_rows (a draft model's head over part of the vocabulary): the
    outputs start..stop-1 alone, equal to the whole weight's, at ranges that cut a repacked
    group of eight rows at either end."""
    from inferpath.kernels.quantized import QuantLinear

    weight = random_weight(Q.Q8_0, 96, 64, seed=3)
    head = QuantLinear(repack(weight) if repacked else weight)
    x = torch.randn(3, 64)
    whole = head(x)
    for start, stop in ((0, 96), (0, 40), (13, 14), (5, 91), (88, 96)):
        torch.testing.assert_close(head.forward_rows(x, start, stop), whole[:, start:stop], rtol=0, atol=0)
    with pytest.raises(IndexError, match="rows 90..97 are outside the 96 rows"):
        head.forward_rows(x, 90, 97)
