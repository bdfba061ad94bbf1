"""Speculative sampling is exact: what the verifier emits is distributed as the target's.

- the rejection rule alone (sampling/rejection.py) on fixed logits, with point-mass
  (n-gram) drafts and with drafts drawn from another distribution (draft model): the
  first emitted token follows p_0, and after an accepted draft the next follows p_1
  (chi-square at a fixed seed; a 2% shift of the target is rejected by the same test);
- the whole engine on a tiny random model with an 8-token vocabulary, ngram and suffix
  drafts: the first token verified with drafts (the second output token) follows the
  target's marginal;
- 200 speculative requests with random aborts, sampled and greedy, every drafter: every
  KV block (the target's and the draft model's) is returned;
- ``--deterministic`` (batch-invariant mode): greedy tokens and logprobs with ngram and
  suffix drafts are bitwise those without.
"""

import random

import pytest
import torch

from inferpath.cache.kv import KVCache
from inferpath.config import EngineConfig, ModelConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.model import Transformer
from inferpath.model.metadata import one_sequence_metadata
from inferpath.models import resolve_model
from inferpath.sampling.params import SamplingParams
from inferpath.sampling.rejection import DraftRows, verify_drafts
from inferpath.sampling.sampler import Sampler, SamplingRow
from inferpath.tokenizer import load_tokenizer

VOCAB = 8
TINY = ModelConfig(architecture="llama", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=256)
ALPHA = 1e-3


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of observed ``counts`` against expected ``probs`` (cells with p > 0)."""
    n = counts.sum()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was drawn"
    expected = n * probs[keep].double()
    stat = ((counts[keep].double() - expected) ** 2 / expected).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def shifted(probs: torch.Tensor, amount: float = 0.02) -> torch.Tensor:
    """``probs`` with ``amount`` of mass moved from its largest to its smallest cell."""
    out = probs.clone().double()
    out[out.argmax()] -= amount
    out[torch.where(out > 0, out, 2.0).argmin()] += amount
    return out


@pytest.mark.parametrize("drafter", ["ngram", "draft_model", "draft_model_vocab_prefix"])
def test_rejection_rule_emits_the_target_distribution(drafter):
    torch.manual_seed(0)
    k, n = 2, 20000
    logits = torch.randn(k + 1, VOCAB) * 1.5  # row j: the target after j drafts
    logits[0, 5] = float("-inf")  # a token the target never emits
    params = SamplingParams(temperature=1.0, max_tokens=10)
    generator = torch.Generator().manual_seed(1)
    if drafter == "ngram":  # a point mass: the same drafts every time
        q = None
        drafts = [(int(logits[0].argmax()), 1)] * n
    else:  # drafts drawn from another distribution q, as a draft model draws them
        q = torch.randn(k, VOCAB).softmax(-1)
        if drafter == "draft_model_vocab_prefix":  # draft_vocab_size 4: q is zero past the prefix
            q[:, 4:] = 0
            q = q / q.sum(-1, keepdim=True)
        drawn = torch.multinomial(q, n, replacement=True, generator=generator)  # (k, n)
        drafts = [tuple(drawn[:, t].tolist()) for t in range(n)]
    rows = [SamplingRow(params, [0], list(d[:j]), generator) for d in drafts for j in range(k + 1)]
    # n independent trials in one call: n chunks over copies of the same k + 1 logits rows
    out = verify_drafts(Sampler(seed=0), logits.repeat(n, 1), rows,
                        [DraftRows(t * (k + 1), drafts[t], q) for t in range(n)])
    first = torch.zeros(VOCAB)
    second = torch.zeros(VOCAB)  # after the first draft was accepted
    for t in range(n):
        emitted = out.runs[t].token_ids
        first[emitted[0]] += 1
        if emitted[0] == drafts[t][0] and len(emitted) > 1:
            second[emitted[1]] += 1
    p = logits.softmax(-1)
    assert chi_square_p(first, p[0]) > ALPHA
    assert chi_square_p(second, p[1]) > ALPHA
    assert chi_square_p(first, shifted(p[0])) < ALPHA  # the test sees a 2% shift
    assert 0.05 * n < second.sum() < 0.95 * n  # drafts both accepted and rejected


def test_greedy_rows_accept_while_the_draft_is_the_argmax():
    logits = torch.zeros(4, VOCAB)
    for j, token in enumerate((2, 6, 1, 4)):
        logits[j, token] = 5.0
    rows = [SamplingRow(SamplingParams(temperature=0), [0], [])] * 4
    run = verify_drafts(Sampler(0), logits, rows, [DraftRows(0, (2, 6, 7))]).runs[0]
    assert run.token_ids == [2, 6, 1] and run.num_accepted == 2 and run.num_drafted == 3
    run = verify_drafts(Sampler(0), logits, rows, [DraftRows(0, (2, 6, 1))]).runs[0]
    assert run.token_ids == [2, 6, 1, 4]  # all accepted: the bonus token


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("smollm2-135m-instruct"))


def tiny_model(seed: int) -> Transformer:
    model = Transformer(TINY)
    model.init_random_weights(seed=seed, std=0.3)
    return model.eval()


def last_probs(model: Transformer, tokens: list[int]) -> torch.Tensor:
    """The target's next-token distribution after ``tokens``, computed alone: (vocab,)."""
    cache = KVCache(TINY, 4, 64, torch.float32)
    meta = one_sequence_metadata(0, len(tokens), 4, 64)
    with torch.inference_mode():
        hidden = model(torch.tensor(tokens), torch.arange(len(tokens)), cache, meta)
        return model.compute_logits(hidden[-1:])[0].softmax(-1)


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
                                  {"method": "suffix", "num_speculative_tokens": 3}], ids=["ngram", "suffix"])
def test_engine_with_point_mass_drafts_samples_the_target_marginal(tokenizer, spec):
    # suffix: the 2000 samples run together, so each also drafts from the others' outputs
    model = tiny_model(0)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    n = 2000
    engine = LLMEngine(model, tokenizer, TINY, EngineConfig(
        num_kv_blocks=2 * n, block_size=16, max_num_seqs=n, max_num_batched_tokens=8 * n,
        speculative_config=spec))
    params = SamplingParams(n=n, max_tokens=4, temperature=1.0, seed=7, ignore_eos=True)
    engine.add_request("r", prompt, params)
    final = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            final = output if output.finished else final
    second, third = torch.zeros(VOCAB), torch.zeros(VOCAB)
    for sample in final.outputs:
        assert len(sample.token_ids) == 4
        second[sample.token_ids[1]] += 1
        third[sample.token_ids[2]] += 1
    # the target's marginals of output tokens 2 and 3, summed over the tokens before them
    p1 = last_probs(model, prompt)
    p2 = {t: last_probs(model, prompt + [t]) for t in range(VOCAB)}
    marginal2 = sum(p1[t] * p2[t] for t in range(VOCAB))
    marginal3 = sum(p1[a] * p2[a][b] * last_probs(model, prompt + [a, b])
                    for a in range(VOCAB) for b in range(VOCAB))
    stats = engine.stats()
    assert stats.num_spec_drafts > n // 2  # most samples verified drafts (an n-gram matched)
    assert 0 < stats.num_spec_accepted_tokens < stats.num_spec_draft_tokens
    assert chi_square_p(second, marginal2) > ALPHA
    assert chi_square_p(third, marginal3) > ALPHA
    assert chi_square_p(second, shifted(marginal2)) < ALPHA


@pytest.mark.parametrize("method", ["ngram", "draft_model", "suffix"])
def test_every_block_is_returned_after_200_requests_with_random_aborts(tokenizer, method):
    spec = {"method": method, "num_speculative_tokens": 4}
    if method == "draft_model":
        spec["model"] = "tiny-random"
    engine = LLMEngine(tiny_model(0), tokenizer, TINY, EngineConfig(
        num_kv_blocks=40, block_size=4, max_num_seqs=12, speculative_config=spec),
        eos_token_ids=[0], draft_model=tiny_model(1))
    rng = random.Random(0)
    live: list[str] = []
    for i in range(200):
        pattern = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 4))]
        prompt = (pattern * 8)[:rng.randint(2, 30)]
        greedy = rng.random() < 0.5
        params = SamplingParams(max_tokens=rng.randint(1, 12), temperature=0 if greedy else 0.8,
                                seed=i, ignore_eos=rng.random() < 0.5)
        engine.add_request(f"r{i}", prompt, params)
        live.append(f"r{i}")
        for _ in range(rng.randint(0, 2)):
            for output in engine.step():
                if output.finished:
                    live.remove(output.request_id)
        if live and rng.random() < 0.2:
            engine.abort_request(rng.choice(live))
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.stats()
    assert stats.num_kv_blocks_used == 0 and stats.num_requests_finished == 200
    assert stats.num_spec_drafts > 0
    if method == "draft_model":
        draft_blocks = engine.speculator.proposer.block_manager
        assert draft_blocks.num_free_blocks == draft_blocks.num_blocks


def test_deterministic_mode_keeps_tokens_and_logprobs_bitwise_with_drafts(tokenizer):
    from inferpath.model.batch_invariant import make_batch_invariant

    config = ModelConfig(architecture="llama", vocab_size=49_152, hidden_size=128, intermediate_size=256,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=512)
    model = Transformer(config)
    model.init_random_weights(seed=0, std=0.08)
    model = make_batch_invariant(model).eval()
    rng = random.Random(3)
    prompts = [([rng.randrange(49_152) for _ in range(rng.randint(1, 4))] * 4)[:rng.randint(3, 14)]
               for _ in range(5)]
    params = SamplingParams(max_tokens=10, temperature=0, logprobs=0, ignore_eos=True)

    def outputs(spec):
        engine = LLMEngine(model, tokenizer, config, EngineConfig(
            block_size=4, num_kv_blocks=256, batch_invariant=True, speculative_config=spec),
            eos_token_ids=[])
        for i, prompt in enumerate(prompts):
            engine.add_request(f"r{i}", prompt, params)
        finals = {}
        while engine.has_unfinished_requests():
            finals.update({o.request_id: o.outputs[0] for o in engine.step() if o.finished})
        return engine, [(c.token_ids, [lp.logprob for lp in c.logprobs])
                        for c in (finals[f"r{i}"] for i in range(len(prompts)))]

    _, plain = outputs(None)
    for method in ("ngram", "suffix"):
        engine, drafted = outputs({"method": method, "num_speculative_tokens": 4})
        assert engine.stats().num_spec_accepted_tokens > 0
        assert drafted == plain  # bitwise: each token attends through its own plan in this mode
