"""Speculative decoding on the real SmolLM2-135M-Instruct GGUF: greedy with drafts is
greedy without, token for token.

The reference is a second path of our own: the same prompts decoded without drafts. The
drafters are ``ngram`` (prompt lookup) and ``draft_model`` with SmolLM2's first 10 layers
as the draft (a weaker model of the same vocabulary: some drafts are accepted, some
not, so both halves of the verifier run). Each run is checked to have really mixed
speculating and plain rows in one step, accepted and rejected drafts, and, where asked,
chunked prefill, a prefix-cache hit and a preemption.
"""

from dataclasses import replace

import pytest
import torch

from inferpath.config import ConfigError, EngineConfig
from inferpath.engine.llm_engine import LLMEngine
from inferpath.model import Transformer, build_model
from inferpath.models import resolve_model
from inferpath.sampling.params import SamplingParams
from inferpath.tokenizer import load_tokenizer
from inferpath.weights import load_checkpoint

REPEAT = "The quick brown fox jumps over the lazy dog. "
PROMPTS = [
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    REPEAT * 3 + "The quick",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "Repeat after me: red green blue. red green blue. red",
    "a b c d e f g a b c d e f g a b c",
    "The capital of France is",
    "Hi",
    "Water boils at a temperature of",
    "Monday, Tuesday, Wednesday, Thursday,",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
    "Once upon a time",
    "The sun rises in the east and sets in the west. The sun rises in the",
    "x = 1\ny = 2\nz = 3\nx = 1\ny =",
    "List three colours:",
    "one two three four one two three four one two",
    "The answer to the question is",
    "January February March April January February",
    "import os\nimport sys\nimport os\nimport",
    "What is two plus two?",
    "cat dog cat dog cat dog cat",
]
GREEDY = SamplingParams(max_tokens=10, temperature=0)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
DRAFT = {"method": "draft_model", "model": "smollm2-first-10-layers", "num_speculative_tokens": 3}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 12}
# the draft's head over SmolLM2's first 4096 token ids (of 49152) and its end-of-sequence ids
DRAFT_PREFIX = {**DRAFT, "draft_vocab_size": 4096}


@pytest.fixture(scope="module")
def parts():
    torch.manual_seed(0)
    checkpoint = load_checkpoint(resolve_model("smollm2-135m-instruct"))
    shallow = Transformer(replace(checkpoint.config, num_layers=10))
    shallow.load_weights({name: t for name, t in checkpoint.tensors.items()
                          if not name.startswith("model.layers.") or int(name.split(".")[2]) < 10})
    return build_model(checkpoint), load_tokenizer(checkpoint.tokenizer_path), checkpoint, shallow.eval()


def make_engine(parts, spec=None, **config) -> LLMEngine:
    model, tokenizer, checkpoint, shallow = parts
    config = {"num_kv_blocks": 128, "max_num_seqs": 8, **config}
    return LLMEngine(model, tokenizer, checkpoint.config, EngineConfig(speculative_config=spec, **config),
                     eos_token_ids=checkpoint.eos_token_ids, draft_model=shallow)


def run(engine, prompts, params=GREEDY):
    """Finished outputs in prompt order; also counts steps that mixed drafted and plain rows."""
    steps = {"mixed": 0, "drafted": 0}
    schedule = engine.scheduler.schedule

    def watching():
        out = schedule()
        num_drafted = sum(bool(c.draft_token_ids) for c in out.chunks)
        steps["drafted"] += num_drafted > 0
        steps["mixed"] += 0 < num_drafted < len(out.chunks)
        return out

    engine.scheduler.schedule = watching
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    finals = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
    return [finals[f"r{i}"] for i in range(len(prompts))], steps


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def plain(parts):
    outputs, _ = run(make_engine(parts), PROMPTS)
    return tokens(outputs)


def check_accepted_and_rejected(engine):
    stats = engine.stats()
    assert stats.num_spec_drafts > 0
    assert 0 < stats.num_spec_accepted_tokens < stats.num_spec_draft_tokens
    assert stats.num_kv_blocks_used == 0


@pytest.mark.parametrize("spec", [NGRAM, DRAFT, SUFFIX, DRAFT_PREFIX],
                         ids=["ngram", "draft_model", "suffix", "draft_model-vocab-prefix"])
def test_greedy_with_drafts_equals_greedy_without_in_batches_of_8(parts, plain, spec):
    engine = make_engine(parts, spec)
    outputs, steps = run(engine, PROMPTS)
    assert tokens(outputs) == plain
    assert steps["mixed"] > 0  # speculating and plain rows in one step
    check_accepted_and_rejected(engine)
    assert engine.stats().mean_acceptance_length > 1


def test_a_draft_vocab_prefix_computes_those_logits_and_the_end_of_sequence_ids_only(parts):
    """draft_vocab_size: the draft's logits are the whole head's on ids below it and on the
    rows' end-of-sequence ids, -inf elsewhere; a size past the vocabulary is refused."""
    engine = make_engine(parts, DRAFT_PREFIX)
    proposer = engine.speculator.proposer
    assert proposer.vocab_rows == 4096
    model = proposer.model
    hidden = torch.randn(2, model.config.hidden_size)
    request = type("R", (), {"grammar": None, "eos_token_ids": frozenset({2, 40000})})()
    logits = proposer._logits(hidden, [request])
    full = model.compute_logits(hidden)
    finite = torch.isfinite(logits)
    assert finite[:, :4096].all() and finite[:, 40000].all() and int(finite.sum()) == 2 * 4097
    torch.testing.assert_close(logits[finite], full[finite])
    with pytest.raises(ConfigError, match="draft_vocab_size 60000 is above the draft model's vocabulary of 49152"):
        make_engine(parts, {**DRAFT, "draft_vocab_size": 60000})


def test_greedy_with_ngram_alone_equals_greedy_without(parts, plain):
    engine = make_engine(parts, NGRAM)
    for prompt, expected in zip(PROMPTS, plain):
        outputs, _ = run(engine, [prompt])
        assert tokens(outputs) == [expected]
    check_accepted_and_rejected(engine)


@pytest.mark.parametrize("spec", [NGRAM, DRAFT, SUFFIX], ids=["ngram", "draft_model", "suffix"])
def test_drafts_compose_with_chunked_prefill_prefix_hits_and_preemption(parts, plain, spec):
    # 9 blocks of 16 slots for 8 sequences of 2-3 blocks each: preemptions are certain;
    # a budget of 24 tokens chunks the prompts; the second pass hits the prefix cache
    engine = make_engine(parts, spec, num_kv_blocks=9, max_num_batched_tokens=24)
    prompts = PROMPTS[:8]
    outputs, _ = run(engine, prompts)
    again, _ = run(engine, prompts)
    assert tokens(outputs) == tokens(again) == plain[:8]
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert stats.num_spec_accepted_tokens > 0 and stats.num_kv_blocks_used == 0


def test_max_tokens_and_logprobs_inside_drafted_runs(parts):
    params = SamplingParams(max_tokens=7, temperature=0, logprobs=2, ignore_eos=True)
    prompts = PROMPTS[:5]
    plain_out, _ = run(make_engine(parts), prompts, params)
    engine = make_engine(parts, NGRAM)
    spec_out, _ = run(engine, prompts, params)
    assert engine.stats().num_spec_accepted_tokens > 0
    for a, b in zip(plain_out, spec_out):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert len(b.outputs[0].token_ids) == 7 and b.outputs[0].finish_reason == "length"
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert x.token_id == y.token_id and x.rank == y.rank
            assert x.logprob == pytest.approx(y.logprob, abs=2e-3)
            assert [t for t, _ in x.top] == [t for t, _ in y.top]


def test_stop_strings_inside_a_drafted_run_end_the_output_at_the_same_place(parts):
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    params = SamplingParams(max_tokens=16, temperature=0, stop=["16"])
    (plain_out,), _ = run(make_engine(parts), [prompt], params)
    engine = make_engine(parts, NGRAM)
    (spec_out,), _ = run(engine, [prompt], params)
    assert plain_out.outputs[0].finish_reason == "stop" and plain_out.outputs[0].stop_reason == "16"
    assert spec_out.outputs[0].text == plain_out.outputs[0].text
    assert spec_out.outputs[0].token_ids == plain_out.outputs[0].token_ids
    assert spec_out.outputs[0].stop_reason == "16"
    assert engine.stats().num_spec_accepted_tokens > 0


@pytest.mark.parametrize("cached", [100, 0])
def test_suffix_drafts_from_earlier_requests_outputs(parts, cached):
    """Prompts whose answers their prompts do not hold, each asked twice: the second time
    the global cache holds the first answer, so its drafts are accepted (and the tokens are
    the plain engine's); with no cache (``max_cached_requests`` 0) the second round drafts
    no better than the first."""
    prompts = ["The capital of France is", "Once upon a time", "What is two plus two?",
               "Water boils at a temperature of"]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    plain_out, _ = run(make_engine(parts), prompts, params)
    engine = make_engine(parts, {**SUFFIX, "suffix_decoding_max_cached_requests": cached})
    accepted = []
    for _ in range(2):
        before = engine.stats().num_spec_accepted_tokens
        for prompt, expected in zip(prompts, plain_out):
            outputs, _ = run(engine, [prompt], params)
            assert tokens(outputs) == [expected.outputs[0].token_ids]
        accepted.append(engine.stats().num_spec_accepted_tokens - before)
    proposer = engine.speculator.proposer
    if cached:
        assert len(proposer.cache.outputs) == 2 * len(prompts)
        assert accepted[1] >= accepted[0] + len(prompts) * 8  # most of each answer drafted from the first
    else:
        assert proposer.cache.num_tokens == 0 and accepted[1] <= accepted[0]
    assert engine.stats().num_kv_blocks_used == 0


def test_suffix_drafts_from_a_running_requests_output(parts):
    """The same prompt asked again while the first request still runs: the second drafts
    from the first's output so far (the cache indexes running outputs as they grow), and
    both give the plain engine's tokens."""
    prompt = "Write a short poem about the sea at night."
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    (expected,), _ = run(make_engine(parts), [prompt], params)
    accepted = {}
    for cached in (100, 0):
        engine = make_engine(parts, {**SUFFIX, "suffix_decoding_max_cached_requests": cached})
        engine.add_request("first", prompt, params)
        for _ in range(20):
            engine.step()
        engine.add_request("second", prompt, params)
        finals = {}
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    finals[output.request_id] = output.outputs[0].token_ids
        assert finals == {"first": expected.outputs[0].token_ids, "second": expected.outputs[0].token_ids}
        accepted[cached] = engine.stats().num_spec_accepted_tokens
    assert accepted[100] >= accepted[0] + 10


def test_speculative_config_is_checked_by_name():
    with pytest.raises(ConfigError, match="'draft_tensor_parallel_size'"):
        EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                         "draft_tensor_parallel_size": 1})
    with pytest.raises(ConfigError, match="'eagle'"):
        EngineConfig(speculative_config='{"method": "eagle", "num_speculative_tokens": 2}')
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    with pytest.raises(ConfigError, match="needs \"model\""):
        EngineConfig(speculative_config={"method": "draft_model", "num_speculative_tokens": 2})
    config = EngineConfig(speculative_config='{"method": "ngram", "num_speculative_tokens": 3}')
    assert config.speculative_config.prompt_lookup_max == 4
    with pytest.raises(ConfigError, match="'prompt_lookup_max' are not implemented for method 'suffix'"):
        EngineConfig(speculative_config={"method": "suffix", "prompt_lookup_max": 3})
    for key, bad in (("suffix_decoding_max_tree_depth", 2), ("suffix_decoding_max_cached_requests", -1),
                     ("suffix_decoding_max_spec_factor", 0), ("suffix_decoding_min_token_prob", 1.5)):
        with pytest.raises(ConfigError, match=key):
            EngineConfig(speculative_config={"method": "suffix", key: bad})
    suffix = EngineConfig(speculative_config={"method": "suffix"}).speculative_config  # vLLM's defaults
    assert (suffix.num_speculative_tokens, suffix.suffix_decoding_max_tree_depth,  # k: the depth, capped at 16
            suffix.suffix_decoding_max_cached_requests, suffix.suffix_decoding_max_spec_factor,
            suffix.suffix_decoding_min_token_prob) == (16, 24, 10000, 1.0, 0.1)
    assert EngineConfig(speculative_config={"method": "suffix", "suffix_decoding_max_tree_depth": 6}
                        ).speculative_config.num_speculative_tokens == 6


def test_the_flag_is_generated_from_the_engine_config():
    import argparse

    from inferpath.cli.engine_flags import add_engine_flags, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    args = parser.parse_args(["--speculative-config",
                              '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'])
    spec = engine_config_from_args(args).speculative_config
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_max) == ("ngram", 4, 4)


def test_the_trace_marks_each_steps_drafts_and_accepted_prefix(parts, plain):
    from inferpath.engine.trace import trace

    engine = make_engine(parts, NGRAM)
    with trace(engine) as tracer:
        outputs, _ = run(engine, [PROMPTS[1]])
    assert tokens(outputs) == [plain[1]]
    verified = [c for s in tracer.all_steps() for c in s.chunks if c.draft_token_ids]
    assert verified and any(c.num_accepted > 0 for c in verified)
    for c in verified:  # the emitted tokens: the accepted prefix of the drafts, then one more
        assert c.emitted_token_ids[:c.num_accepted] == c.draft_token_ids[:c.num_accepted]
        assert len(c.emitted_token_ids) == c.num_accepted + 1


def test_spec_decode_metrics_are_exported_with_vllm_names():
    from prometheus_client import CollectorRegistry, generate_latest

    from inferpath.engine.outputs import EngineStats
    from inferpath.server.metrics import EngineStatsCollector

    stats = EngineStats(0, 0, 0, 1, 0, 0, 0, 0, 9, num_spec_drafts=3, num_spec_draft_tokens=12,
                        num_spec_accepted_tokens=5, spec_accepted_per_pos=(3, 1, 1, 0))
    registry = CollectorRegistry()
    registry.register(EngineStatsCollector(lambda: stats, "m"))
    text = generate_latest(registry).decode()
    assert 'inferpath:spec_decode_num_drafts_total{model_name="m"} 3.0' in text
    assert 'inferpath:spec_decode_num_draft_tokens_total{model_name="m"} 12.0' in text
    assert 'inferpath:spec_decode_num_accepted_tokens_total{model_name="m"} 5.0' in text
    assert 'inferpath:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 1.0' in text
    assert stats.mean_acceptance_length == pytest.approx(1 + 5 / 3)


def test_ngram_speculation_pauses_on_text_it_cannot_copy(parts):
    """Prompts whose continuations the prompt does not hold: drafts are tried, mostly
    rejected, then paused (engine/spec/acceptance.py); the output is as without drafts."""
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    prompts = ["Tell me about your favourite season and why you like it.",
               "Write a short poem about the sea at night."]
    engine = make_engine(parts, NGRAM)
    trackers = set()
    schedule = engine.scheduler.schedule

    def watching():
        out = schedule()
        trackers.update(c.request.spec_acceptance for c in out.chunks if c.request.spec_acceptance)
        return out

    engine.scheduler.schedule = watching
    spec_out, _ = run(engine, prompts, params)
    plain_out, _ = run(make_engine(parts), prompts, params)
    assert tokens(spec_out) == tokens(plain_out)
    assert trackers and any(t.num_pauses for t in trackers)
    stats = engine.stats()
    assert 0 < stats.num_spec_drafts < 0.5 * len(prompts) * 48  # mostly plain steps
