"""The sampler against direct computations: masks, penalties, draws, seeds, logprobs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from inferpath.sampling import (
    Sampler,
    SamplerOutput,
    SamplingParams,
    SamplingRow,
    TokenLogprobs,
)
from inferpath.sampling.penalties import apply_penalties
from inferpath.sampling.sampler import draw_from_probs
from inferpath.sampling.truncation import apply_truncation


def row(params: SamplingParams, prompt=(1, 2), output=(), generator=None, eos=()) -> SamplingRow:
    return SamplingRow(params, list(prompt), list(output), generator, eos)


def seeded(seed: int, **kwargs) -> SamplingRow:
    params = SamplingParams(seed=seed, **kwargs)
    return row(params, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- direct references


def reference_keep(logits: np.ndarray, k: int, p: float, min_p: float) -> set[int]:
    """Tokens kept by top-k, then top-p, then min-p, computed one token at a time."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    kept = order if k <= 0 else [i for i in order if logits[i] >= logits[order[min(k, len(order)) - 1]]]
    if p < 1.0:
        weights = [math.exp(logits[i] - logits[order[0]]) for i in kept]
        total, mass, prefix = sum(weights), 0.0, []
        for i, w in zip(kept, weights):
            prefix.append(i)
            mass += w / total
            if mass >= p:
                break
        kept = prefix
    if min_p > 0.0:
        top = max(logits[i] for i in kept)
        kept = [i for i in kept if math.exp(logits[i] - top) >= min_p]
    return set(kept)


def truncated_distribution(logits: np.ndarray, temperature: float, k: int, p: float, min_p: float) -> np.ndarray:
    scaled = logits / temperature
    keep = reference_keep(scaled, k, p, min_p)
    probs = np.zeros(len(logits))
    for i in keep:
        probs[i] = math.exp(scaled[i] - scaled.max())
    return probs / probs.sum()


# ---------------------------------------------------------------- masks

MASK_CASES = [(0, 1.0, 0.0), (5, 1.0, 0.0), (1, 1.0, 0.0), (0, 0.5, 0.0), (0, 0.9, 0.0), (10, 0.8, 0.0),
              (0, 1.0, 0.1), (0, 1.0, 0.5), (20, 0.95, 0.05), (3, 0.3, 0.9), (0, 0.01, 0.0), (64, 1.0, 1.0),
              (0, 0.99, 0.0)]
BIG_K_CASES = [(2000, 0.9, 0.0), (5000, 1.0, 0.0), (0, 0.9, 0.0)]


@pytest.mark.parametrize("cases", [MASK_CASES, BIG_K_CASES], ids=["small_k", "big_k"])
@pytest.mark.parametrize("vocab,scale", [(64, 3.0), (3000, 0.3), (3000, 8.0)])
def test_top_k_top_p_min_p_masks_match_direct_computation(vocab, scale, cases):
    # With vocab 3000, small k and flat logits, top-p needs more than the top-1024
    # candidates and the full-sort fallback runs for those rows; with peaked ones not.
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(len(cases), vocab, generator=gen) * scale  # (rows, vocab)
    ks, ps, min_ps = zip(*cases)
    masked = apply_truncation(logits, list(ks), list(ps), list(min_ps))
    for i, (k, p, min_p) in enumerate(cases):
        kept = set(torch.nonzero(torch.isfinite(masked[i])).flatten().tolist())
        assert kept == reference_keep(logits[i].double().numpy(), k, p, min_p), (k, p, min_p)
        # Kept logits are untouched.
        assert torch.equal(masked[i][sorted(kept)], logits[i][sorted(kept)])


def test_top_k_keeps_ties_with_the_kth_logit():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]])
    masked = apply_truncation(logits, top_k=[2])
    assert torch.isfinite(masked[0]).tolist() == [True, False, True, True, False]


def test_draw_never_picks_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [0.2, 0.0, 0.0, 0.0, 0.0]])
    edges = torch.tensor([0.0, 0.4999999, 0.5, 1.0 - 2**-53, 1.0], dtype=torch.float64)  # 1.0: u x total rounded up
    for u in edges:
        tokens = draw_from_probs(probs, u.expand(2, 1)).tolist()
        assert tokens[0] in (1, 3) and tokens[1] == 0
    assert draw_from_probs(probs, torch.tensor([[0.49], [0.0]], dtype=torch.float64)).tolist() == [1, 0]
    assert draw_from_probs(probs, torch.tensor([[0.51], [0.9]], dtype=torch.float64)).tolist() == [3, 0]


# ---------------------------------------------------------------- greedy and penalties


def test_greedy_is_argmax_and_input_is_untouched():
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(1))
    before = logits.clone()
    rows = [row(SamplingParams(temperature=t)) for t in (0.0, 0.0, 1e-6, 0.0, 0.0, 0.0)]
    out = Sampler(seed=0)(logits, rows)
    assert isinstance(out, SamplerOutput)
    assert out.token_ids == logits.argmax(dim=-1).tolist()
    assert out.logprobs == [None] * 6
    assert torch.equal(logits, before)


def test_penalty_arithmetic_matches_hand_computation():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0, 4.0]])
    prompt, output = [0, 1], [2, 2, 3, 2]
    got = apply_penalties(logits, [prompt], [output], [2.0], [0.5], [0.25])[0].tolist()
    expected = [
        2.0 / 2.0,  # in the prompt, positive: divided
        -1.0 * 2.0,  # in the prompt, negative: multiplied
        0.5 / 2.0 - 0.5 * 3 - 0.25,  # output 3 times: repetition, then 3 x frequency, presence
        -3.0 * 2.0 - 0.5 * 1 - 0.25,  # output once
        1.0,  # unseen
        4.0,  # unseen
    ]
    assert got == pytest.approx(expected, abs=1e-6)


def test_penalties_apply_per_row_and_change_the_greedy_choice():
    logits = torch.tensor([[5.0, 4.9, 0.0], [5.0, 4.9, 0.0]])
    rows = [
        row(SamplingParams(temperature=0.0, presence_penalty=1.0), prompt=[], output=[0]),
        row(SamplingParams(temperature=0.0), prompt=[], output=[0]),
    ]
    assert Sampler()(logits, rows).token_ids == [1, 0]
    rows = [row(SamplingParams(temperature=0.0, repetition_penalty=1.5), prompt=[0], output=[])]
    assert Sampler()(logits[:1], rows).token_ids == [1]


def test_min_tokens_bans_eos_and_stop_token_ids_until_reached():
    logits = torch.tensor([[0.0, 1.0, 9.0, 8.0, 7.0]] * 4)
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[3])
    rows = [
        row(params, output=[1], eos={2}),  # short: EOS (2) and stop id (3) banned
        row(params, output=[1, 1], eos={2}),  # reached: EOS allowed
        row(SamplingParams(temperature=0.0, min_tokens=2, ignore_eos=True), output=[], eos={2}),
        row(SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[3]), output=[], eos={2, 99}),
    ]
    assert Sampler()(logits, rows).token_ids == [4, 2, 2, 4]


# ---------------------------------------------------------------- seeds


def sample_steps(sampler: Sampler, logits_steps: list[torch.Tensor], rows: list[SamplingRow]) -> list[list[int]]:
    return [sampler(logits, rows).token_ids for logits in logits_steps]


def test_same_seed_gives_same_tokens_whatever_the_batch():
    gen = torch.Generator().manual_seed(2)
    vocab, num_steps = 1000, 5
    target_logits = [torch.randn(vocab, generator=gen) for _ in range(num_steps)]
    settings = {"temperature": 0.9, "top_p": 0.95, "top_k": 50}

    def run(position: int, others: list[SamplingRow], sampler_seed: int) -> list[int]:
        rows = list(others)
        rows.insert(position, seeded(1234, **settings))
        steps = []
        for logits in target_logits:
            batch = torch.randn(len(rows), vocab, generator=gen)
            batch[position] = logits
            steps.append(Sampler(seed=sampler_seed)(batch, rows).token_ids[position])
        return steps

    alone = run(0, [], 0)
    in_batch = run(2, [row(SamplingParams()), seeded(7, min_p=0.1), row(SamplingParams(temperature=0.0))], 1)
    last = run(4, [seeded(1234, **settings), row(SamplingParams(top_k=3))] * 2, 2)
    assert alone == in_batch == last
    other_seed = [run(0, [], 0)]  # fresh generator, same seed: same again
    assert other_seed[0] == alone


def test_different_seeds_and_unseeded_rows_differ():
    logits = torch.zeros(1, 1000)  # uniform: any two independent draws rarely agree
    steps = [logits] * 8
    a = sample_steps(Sampler(), steps, [seeded(1)])
    b = sample_steps(Sampler(), steps, [seeded(2)])
    assert a != b
    shared = Sampler(seed=5)
    c = sample_steps(shared, steps, [row(SamplingParams())])
    d = sample_steps(Sampler(seed=5), steps, [row(SamplingParams())])
    assert c == d  # the shared generator is seeded by Sampler(seed=...)
    assert len({token for step in c for token in step}) > 1


# ---------------------------------------------------------------- the draw's distribution

# 99.9% quantiles of the chi-square distribution by degrees of freedom.
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59}


def chi_square(counts: np.ndarray, probs: np.ndarray, num_draws: int) -> tuple[float, int]:
    support = probs > 0
    expected = probs[support] * num_draws
    return float((((counts[support] - expected) ** 2) / expected).sum()), int(support.sum()) - 1


@pytest.mark.parametrize(
    "temperature,k,p,min_p",
    [(1.0, 0, 1.0, 0.0), (0.7, 6, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.08), (0.8, 7, 0.9, 0.02)],
)
def test_draws_follow_the_truncated_distribution(temperature, k, p, min_p):
    logits = torch.tensor([2.0, 1.5, 1.0, 0.7, 0.5, 0.0, -0.5, -1.0, -2.0, -4.0])
    expected = truncated_distribution(logits.double().numpy(), temperature, k, p, min_p)
    params = SamplingParams(temperature=temperature, top_k=k, top_p=p, min_p=min_p)
    num_draws = 40_000
    tokens = Sampler(seed=11)(logits.expand(num_draws, -1), [row(params)] * num_draws).token_ids
    counts = np.bincount(tokens, minlength=len(logits)).astype(float)
    assert counts[expected == 0].sum() == 0, "a truncated token was drawn"
    stat, dof = chi_square(counts, expected, num_draws)
    assert stat < CHI2_999[dof], (stat, dof, counts / num_draws, expected)


def test_seeded_rows_draw_from_the_same_distribution():
    logits = torch.tensor([1.0, 0.0, -1.0, 0.5, -3.0])
    expected = truncated_distribution(logits.double().numpy(), 1.0, 4, 1.0, 0.0)
    rows = [seeded(s, top_k=4) for s in range(3000)]
    tokens = Sampler()(logits.expand(len(rows), -1), rows).token_ids
    counts = np.bincount(tokens, minlength=5).astype(float)
    assert counts[4] == 0
    stat, dof = chi_square(counts, expected, len(rows))
    assert stat < CHI2_999[dof]


# ---------------------------------------------------------------- logprobs


def test_logprobs_are_the_raw_log_softmax_with_top_n_and_rank():
    logits = torch.randn(3, 200, generator=torch.Generator().manual_seed(3))
    rows = [
        row(SamplingParams(temperature=0.0, logprobs=5, repetition_penalty=1.7), output=[int(logits[0].argmax())]),
        row(SamplingParams(temperature=0.5, logprobs=0, seed=3), generator=torch.Generator().manual_seed(3)),
        row(SamplingParams(temperature=1.0)),
    ]
    out = Sampler(seed=0)(logits, rows)
    reference = torch.log_softmax(logits.double(), dim=-1)
    assert out.logprobs[2] is None
    for i in (0, 1):
        lp = out.logprobs[i]
        assert isinstance(lp, TokenLogprobs)
        token = out.token_ids[i]
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(reference[i, token].item(), abs=1e-5)
        assert lp.rank == int((reference[i] > reference[i, token]).sum()) + 1
    # Row 0: the penalty moved the argmax off the raw argmax, so the rank is > 1.
    assert out.logprobs[0].rank > 1
    order = reference[0].argsort(descending=True)[:5].tolist()
    assert [t for t, _ in out.logprobs[0].top] == order
    assert [v for _, v in out.logprobs[0].top] == pytest.approx(reference[0, order].tolist(), abs=1e-5)
    assert out.logprobs[1].top == []


def test_logits_shape_must_match_rows():
    with pytest.raises(ValueError, match="num_rows=2"):
        Sampler()(torch.zeros(3, 10), [row(SamplingParams())] * 2)


# ---------------------------------------------------------------- params validation

INVALID = [
    ("n", 0), ("n", 1.5), ("max_tokens", 0), ("max_tokens", -3), ("temperature", -0.1),
    ("temperature", float("nan")), ("temperature", float("inf")), ("top_p", 0.0), ("top_p", 1.01),
    ("top_k", -2), ("top_k", 2.5), ("min_p", -0.01), ("min_p", 1.5), ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0), ("presence_penalty", 2.5), ("presence_penalty", -2.01),
    ("frequency_penalty", 3.0), ("frequency_penalty", -2.5), ("seed", 1.5), ("seed", "7"), ("seed", 2**63),
    ("logprobs", -1), ("logprobs", 21), ("min_tokens", -1), ("stop", ""), ("stop", ["a", 3]),
    ("stop_token_ids", [-1]), ("stop_token_ids", ["x"]), ("ignore_eos", "yes"),
]


BOOLS_AND_LISTS = ("stop", "stop_token_ids", "ignore_eos")  # no numeric range to state


@pytest.mark.parametrize("name,value", INVALID, ids=[f"{n}={v!r}" for n, v in INVALID])
def test_invalid_parameters_raise_naming_parameter_and_value(name, value):
    with pytest.raises(ValueError) as excinfo:
        SamplingParams(**{name: value})
    message = str(excinfo.value)
    assert message.startswith(f"{name} must be "), message
    assert repr(value) in message or name == "stop", message
    assert any(c.isdigit() for c in message.split(", got")[0]) or name in BOOLS_AND_LISTS, message


def test_min_tokens_above_max_tokens_names_both():
    with pytest.raises(ValueError, match=r"min_tokens must be <= max_tokens \(4\), got 5"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_valid_parameters_are_normalised():
    params = SamplingParams(stop="###", top_k=-1, stop_token_ids=[5, 6], max_tokens=None, min_tokens=100)
    assert params.stop == ("###",) and params.top_k == 0 and params.stop_token_ids == (5, 6)
    assert SamplingParams(stop=["a", "bc"]).max_stop_str_len == 2
    assert SamplingParams(temperature=0).is_greedy and not SamplingParams().is_greedy
    assert not SamplingParams().has_penalties and SamplingParams(presence_penalty=0.1).has_penalties
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 0.5


# ---------------------------------------------------------------- hostile logits

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_HOSTILE_VALUES = st.sampled_from([float("nan"), float("inf"), float("-inf"), 3.0e38, -3.0e38,
                                   1e30, -1e30, 0.0, 1.0, -1.0, 1e-38])
_EXTREME_PARAMS = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0.0, 1e-5, 5e-6, 0.7, 1e300]),
    "top_p": st.sampled_from([1e-300, 0.5, 1.0]),
    "top_k": st.sampled_from([0, 1, 3, 10**9]),
    "min_p": st.sampled_from([0.0, 0.5, 1.0]),
    "repetition_penalty": st.sampled_from([1e-300, 1.0, 1.3, 1e300]),
    "frequency_penalty": st.sampled_from([-2.0, 0.0, 2.0]),
    "presence_penalty": st.sampled_from([-2.0, 0.0, 2.0]),
    "logprobs": st.sampled_from([None, 0, 20]),
    "min_tokens": st.sampled_from([0, 3]),
})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4).flatmap(lambda num_rows: st.tuples(
    st.lists(st.lists(st.one_of(_HOSTILE_VALUES, st.floats(-50, 50)), min_size=8, max_size=8),
             min_size=num_rows, max_size=num_rows),
    st.lists(_EXTREME_PARAMS, min_size=num_rows, max_size=num_rows))))
def test_sampler_returns_in_vocabulary_ids_or_a_row_error_whatever_the_logits(case):
    """Logits with NaN, ±inf and values near float32's limits, under extreme parameters:
    every row gets an id in [0, vocab) and finite logprobs, or an error of its own; a row
    with only finite logits and a usable distribution never errs."""
    values, param_sets = case
    logits = torch.tensor(values, dtype=torch.float32)  # (num_rows, 8)
    rows = [row(SamplingParams(seed=i, **kw), prompt=(1, 2, 5), output=(2, 2, 7),
                generator=torch.Generator().manual_seed(i), eos=(6,))
            for i, kw in enumerate(param_sets)]
    out = Sampler(seed=0)(logits, rows)
    assert len(out.token_ids) == len(out.errors) == len(rows)
    for i, (token_id, error) in enumerate(zip(out.token_ids, out.errors)):
        assert 0 <= token_id < logits.shape[1]
        if error is not None:
            assert error.startswith("sampling failed for this request") and out.logprobs[i] is None
            assert math.isnan(values[i][0]) or any(math.isnan(v) or math.isinf(v) or abs(v) > 1e29
                                                   for v in values[i]), error
            continue
        if rows[i].params.logprobs is not None:
            lp = out.logprobs[i]
            assert math.isfinite(lp.logprob) and all(math.isfinite(v) for _, v in lp.top)
        assert not math.isnan(logits[i, token_id])  # a NaN token is never chosen


def test_a_nan_row_fails_alone_and_the_others_are_sampled_as_without_it():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    rows = [seeded(i, temperature=0.8) for i in range(3)]
    clean = Sampler(seed=0)(logits, rows)
    poisoned = logits.clone()
    poisoned[1, 7] = float("nan")
    rows = [seeded(i, temperature=0.8) for i in range(3)]
    out = Sampler(seed=0)(poisoned, rows)
    assert out.errors[0] is None and out.errors[2] is None
    assert "its logits became NaN" in out.errors[1] and "temperature=0.8" in out.errors[1]
    assert [out.token_ids[0], out.token_ids[2]] == [clean.token_ids[0], clean.token_ids[2]]


def test_infinite_logits_keep_only_the_infinite_tokens():
    logits = torch.tensor([[0.0, float("inf"), 3.0, float("inf")]] * 64)
    rows = [seeded(i) for i in range(64)]
    out = Sampler(seed=0)(logits, rows)
    assert not any(out.errors) and set(out.token_ids) == {1, 3}


@pytest.mark.parametrize("native", [False, True], ids=["torch-argmax", "native-argmax"])
def test_greedy_rows_settle_in_the_argmax_pass(native):
    """Greedy rows alone take one pass (the argmax's, its logit checked): a NaN row and a row
    of -inf fail alone, a row holding +inf takes its first +inf token, the others their
    argmax, as the settle pass before the argmax would give."""
    argmax = None
    if native:
        from inferpath.kernels import build
        from inferpath.kernels.ops import argmax_rows
        if build.native_argmax(torch.float32) is None:
            pytest.skip("the native argmax kernel is not built on this machine")
        argmax = argmax_rows
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(3))
    logits[1, 9] = float("nan")
    logits[2] = float("-inf")
    logits[3, 5] = logits[3, 30] = float("inf")
    logits[4, 12] = 50.0
    out = Sampler(seed=0, argmax=argmax)(logits, [row(SamplingParams(temperature=0)) for _ in range(5)])
    assert out.errors[0] is None and out.token_ids[0] == int(logits[0].argmax())
    assert "its logits became NaN" in out.errors[1]
    assert "every logit is -inf" in out.errors[2]
    assert out.errors[3] is None and out.token_ids[3] == 5
    assert out.errors[4] is None and out.token_ids[4] == 12
    assert all(0 <= t < 40 for t in out.token_ids)


def test_tiny_repetition_penalty_is_a_strong_preference_not_a_crash():
    """1e-300 underflows float32 to 0 (which made logits infinite and softmax NaN): it acts
    as float32's smallest positive penalty, so seen tokens with positive logits win."""
    logits = torch.tensor([[1.0, 2.0, 0.5, 3.0]])
    out = Sampler(seed=0)(logits, [seeded(0, repetition_penalty=1e-300)])
    assert out.errors == [None] and out.token_ids[0] in (1, 2)  # prompt (1, 2) was seen
