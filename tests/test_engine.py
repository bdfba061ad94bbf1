"""LLMEngine on the real SmolLM2-135M-Instruct GGUF: batching, chunked prefill, prefix
caching, preemption, abort, stopping and seeded sampling.

The reference is always a second path of our own: a prompt run alone (greedy) against
the same prompt batched, chunked, cached or preempted. One model is loaded per module
and shared by small engines, each with its own KV cache.
"""

import pytest

from inferpath.config import EngineConfig
from inferpath.engine import RequestError
from inferpath.engine.llm_engine import LLMEngine
from inferpath.model import build_model
from inferpath.models import resolve_model
from inferpath.sampling.params import SamplingParams
from inferpath.tokenizer import load_tokenizer
from inferpath.weights import load_checkpoint

PROMPTS = [
    "The capital of France is",
    "1, 2, 3, 4,",
    "Water boils at a temperature of one hundred degrees Celsius when the pressure is",
    "Hi",
]
GREEDY = SamplingParams(max_tokens=8, temperature=0)


@pytest.fixture(scope="module")
def parts():
    checkpoint = load_checkpoint(resolve_model("smollm2-135m-instruct"))
    return build_model(checkpoint), load_tokenizer(checkpoint.tokenizer_path), checkpoint


def make_engine(parts, eos_token_ids=None, **config) -> LLMEngine:
    model, tokenizer, checkpoint = parts
    config = {"num_kv_blocks": 48, **config}
    eos = checkpoint.eos_token_ids if eos_token_ids is None else eos_token_ids
    return LLMEngine(model, tokenizer, checkpoint.config, EngineConfig(**config), eos_token_ids=eos)


def run(engine, prompts, params=GREEDY, max_steps=500):
    """Submit all prompts, step until no request is left; returns the finished outputs of
    these prompts in order, and every output of these prompts."""
    ids = [f"r{i}" for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts):
        engine.add_request(request_id, prompt, params)
    finals, every = {}, []
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            if output.request_id in ids:
                every.append(output)
                if output.finished:
                    finals[output.request_id] = output
    assert sorted(finals) == sorted(ids)
    return [finals[request_id] for request_id in ids], every


def tokens(outputs, index=0):
    return [o.outputs[index].token_ids for o in outputs]


@pytest.fixture(scope="module")
def alone(parts):
    """Greedy tokens of each prompt, run alone without prefix caching."""
    engine = make_engine(parts, enable_prefix_caching=False)
    return [tokens(run(engine, [p])[0])[0] for p in PROMPTS]


def test_static_batch_of_different_lengths_equals_alone(parts, alone):
    engine = make_engine(parts)
    outputs, _ = run(engine, PROMPTS)
    assert tokens(outputs) == alone
    assert all(len(t) == 8 for t in alone)
    assert engine.stats().num_kv_blocks_used == 0


def test_chunked_prefill_gives_the_same_tokens(parts, alone):
    engine = make_engine(parts, max_num_batched_tokens=5)
    outputs, _ = run(engine, PROMPTS[1:3])
    assert tokens(outputs) == alone[1:3]


def test_prefix_hit_computes_only_the_unshared_tokens(parts):
    engine = make_engine(parts)
    shared = "You are a helpful assistant who answers in French. " * 3
    first, second = shared + "Bonjour", shared + "What is the capital of Italy?"
    run(engine, [first])
    before = engine.stats()
    (output,), _ = run(engine, [second])
    after = engine.stats()
    num_prompt = len(output.prompt_token_ids)
    num_shared = len(engine.tokenizer.encode(shared))
    assert output.num_cached_tokens == (num_shared // 16) * 16 >= 16
    assert after.num_prompt_tokens_computed - before.num_prompt_tokens_computed == (
        num_prompt - output.num_cached_tokens)
    assert after.prefix_cache_hits - before.prefix_cache_hits == output.num_cached_tokens
    uncached = make_engine(parts, enable_prefix_caching=False)
    assert tokens([output]) == tokens(run(uncached, [second])[0])


def test_tiny_kv_cache_forces_preemption_and_outputs_are_unchanged(parts, alone):
    engine = make_engine(parts, num_kv_blocks=4)  # 64 token slots for 4 sequences
    outputs, _ = run(engine, PROMPTS)
    stats = engine.stats()
    assert stats.num_preemptions > 0
    assert tokens(outputs) == alone
    assert stats.num_kv_blocks_used == 0


def test_abort_frees_all_blocks(parts):
    engine = make_engine(parts)
    params = SamplingParams(max_tokens=50, temperature=0)
    engine.add_request("a", PROMPTS[2], params)
    engine.add_request("b", PROMPTS[0], SamplingParams(max_tokens=50, n=2, seed=1))
    engine.step()
    engine.step()
    assert engine.stats().num_kv_blocks_used > 0
    engine.abort_request("a")
    engine.abort_request("b")
    outputs = engine.step()
    assert {o.request_id for o in outputs} == {"a", "b"} and all(o.finished for o in outputs)
    assert all(c.finish_reason == "abort" for o in outputs for c in o.outputs)
    assert engine.stats().num_kv_blocks_used == 0 and not engine.has_unfinished_requests()


def test_eos_stops_and_is_not_in_the_text(parts):
    engine = make_engine(parts)
    prompt = engine.tokenizer.encode_chat(
        [{"role": "user", "content": "Reply with one word: yes or no. Is the sky blue?"}])
    (output,), _ = run(engine, [prompt], SamplingParams(max_tokens=24, temperature=0))
    completion = output.outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason is None
    assert completion.token_ids[-1] in engine.eos_token_ids and len(completion.token_ids) < 24
    assert "<|im_end|>" not in completion.text and completion.text.strip()


def test_stop_token_id_and_max_tokens_stop(parts, alone):
    engine = make_engine(parts)
    stop_id = alone[0][3]
    (stopped,), _ = run(engine, [PROMPTS[0]], SamplingParams(max_tokens=8, temperature=0,
                                                             stop_token_ids=[stop_id]))
    assert stopped.outputs[0].token_ids == alone[0][:alone[0].index(stop_id) + 1]
    assert (stopped.outputs[0].finish_reason, stopped.outputs[0].stop_reason) == ("stop", stop_id)
    (capped,), _ = run(engine, [PROMPTS[0]], SamplingParams(max_tokens=3, temperature=0))
    assert capped.outputs[0].token_ids == alone[0][:3] and capped.outputs[0].finish_reason == "length"


def test_stop_string_is_cut_and_never_streamed(parts, alone):
    engine = make_engine(parts)
    full = engine.tokenizer.decode(alone[1])  # " 5, 6, 7, ..."
    stop = "6, 7"
    assert stop in full
    (output,), every = run(engine, [PROMPTS[1]], SamplingParams(max_tokens=8, temperature=0, stop=stop))
    completion = output.outputs[0]
    assert completion.text == full[:full.index(stop)]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
    streamed = "".join(o.outputs[0].delta_text for o in every)
    assert streamed == completion.text


def test_seeded_sampling_is_the_same_in_any_batch(parts):
    params = SamplingParams(max_tokens=6, temperature=1.0, top_p=0.9, seed=1234)
    engine = make_engine(parts)
    (solo,), _ = run(engine, [PROMPTS[2]], params)
    others = SamplingParams(max_tokens=6, temperature=1.0)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"other{i}", prompt, others)
    (batched,), _ = run(engine, [PROMPTS[2]], params)
    assert tokens([batched]) == tokens([solo])


def test_n_samples_share_the_prompt_blocks_and_follow_seed_plus_i(parts):
    engine = make_engine(parts)
    prompt = PROMPTS[2] + " " + PROMPTS[0]  # two full blocks of 16
    params = SamplingParams(max_tokens=5, temperature=1.0, n=3, seed=7)
    (output,), _ = run(engine, [prompt], params)
    assert [c.index for c in output.outputs] == [0, 1, 2]
    num_prompt = len(output.prompt_token_ids)
    num_cached_per_sample = ((num_prompt - 1) // 16) * 16
    assert engine.stats().prefix_cache_hits == 2 * num_cached_per_sample > 0
    for i in range(3):  # sample i is what a single request seeded seed + i draws
        single = make_engine(parts)
        (one,), _ = run(single, [prompt], SamplingParams(max_tokens=5, temperature=1.0, seed=7 + i))
        assert output.outputs[i].token_ids == one.outputs[0].token_ids


def test_rejects_prompts_that_cannot_run(parts):
    engine = make_engine(parts, max_model_len=32)
    with pytest.raises(RequestError, match=r"40 tokens.*max_model_len is 32"):
        engine.add_request("long", [5] * 40, GREEDY)
    tiny = make_engine(parts, num_kv_blocks=2)
    with pytest.raises(RequestError, match=r"40 tokens.*holds only 32 tokens"):
        tiny.add_request("big", [5] * 40, GREEDY)
    with pytest.raises(RequestError, match="not in"):
        engine.add_request("bad", [10**9], GREEDY)
    assert not engine.has_unfinished_requests()


def test_logprobs_follow_each_token_and_the_stream(parts, alone):
    engine = make_engine(parts)
    (output,), every = run(engine, [PROMPTS[0]], SamplingParams(max_tokens=3, temperature=0, logprobs=2))
    completion = output.outputs[0]
    assert completion.token_ids == alone[0][:3]
    assert [lp.token_id for lp in completion.logprobs] == completion.token_ids
    for lp in completion.logprobs:  # greedy: the chosen token is the top one
        assert len(lp.top) == 2 and lp.top[0][0] == lp.token_id and lp.logprob <= 0
    streamed = [lp for o in every for lp in o.outputs[0].delta_logprobs]
    assert streamed == completion.logprobs


def test_request_joining_mid_decode_shares_a_mixed_step_and_equals_alone(parts, alone):
    engine = make_engine(parts)
    engine.add_request("first", PROMPTS[0], GREEDY)
    for _ in range(3):
        engine.step()
    engine.add_request("late", PROMPTS[2], GREEDY)
    scheduled = engine.scheduler.schedule  # observe the next step's batch
    seen = []

    def spy():
        out = scheduled()
        seen.append([(c.request.request_id, c.num_new_tokens) for c in out.chunks])
        return out

    engine.scheduler.schedule = spy
    finals = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output.outputs[0].token_ids
    n_late = len(engine.tokenizer.encode(PROMPTS[2]))
    assert seen[0] == [("first", 1), ("late", n_late)]  # one decode and one prefill together
    assert finals == {"first": alone[0], "late": alone[2]}


# ---------------------------------------------------------------- fault isolation
EXTREMES = [
    {"repetition_penalty": 1e-300}, {"repetition_penalty": 1e300},
    {"temperature": 1e-5}, {"temperature": 1e300}, {"temperature": 5e-6},
    {"top_p": 1e-300}, {"min_p": 1.0}, {"top_k": 1}, {"top_k": 10**9},
    {"frequency_penalty": 2.0, "presence_penalty": -2.0}, {"frequency_penalty": -2.0},
    {"logprobs": 20, "temperature": 1e300, "repetition_penalty": 1e-300},
    {"min_tokens": 3, "repetition_penalty": 1e-300, "temperature": 1e-4},
]


@pytest.fixture(scope="module")
def alone_greedy(parts):
    """PROMPTS[:2] run alone, greedy (the reference of the fault-isolation tests)."""
    return run(make_engine(parts), PROMPTS[:2])[0]


def test_extreme_sampling_values_complete_or_fail_alone(parts, alone_greedy):
    """Requests with every sampling parameter at its extreme accepted values run beside
    greedy ones: each completes (in-vocabulary tokens, finite logprobs) or fails alone
    with an error; the greedy ones produce exactly their tokens alone."""
    engine = make_engine(parts, num_kv_blocks=128, max_num_seqs=32)
    alone = alone_greedy
    for i, prompt in enumerate(PROMPTS[:2]):
        engine.add_request(f"g{i}", prompt, GREEDY)
    for i, extreme in enumerate(EXTREMES):
        engine.add_request(f"x{i}", PROMPTS[3], SamplingParams(max_tokens=4, seed=i, **extreme))
    finals = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
    vocab = parts[2].config.vocab_size
    for i in range(2):
        assert finals[f"g{i}"].outputs[0].token_ids == alone[i].outputs[0].token_ids
    for i in range(len(EXTREMES)):
        completion = finals[f"x{i}"].outputs[0]
        assert completion.finish_reason in ("length", "stop", "error"), EXTREMES[i]
        assert all(0 <= t < vocab for t in completion.token_ids)
        for lp in completion.logprobs or ():
            assert lp.logprob == lp.logprob and abs(lp.logprob) < float("inf")
    assert engine.stats().num_kv_blocks_used == 0


def test_a_request_whose_logits_become_nan_fails_alone(parts, alone_greedy):
    """A NaN row (forced here for requests with seed 666) fails that request with a
    clear error; the rest of the batch, in the same steps, is untouched."""
    engine = make_engine(parts, num_kv_blocks=96)
    alone = alone_greedy
    sampler = engine.runner.sampler
    real_call = type(sampler).__call__

    def poisoned(self, logits, rows):
        logits = logits.clone()
        for i, row in enumerate(rows):
            if row.params.seed == 666 and row.output_token_ids:
                logits[i, 17] = float("nan")
        return real_call(self, logits, rows)

    engine.runner.sampler = type("Poisoned", (type(sampler),), {"__call__": poisoned})(seed=0)
    for i, prompt in enumerate(PROMPTS[:2]):
        engine.add_request(f"g{i}", prompt, GREEDY)
    engine.add_request("bad", PROMPTS[3], SamplingParams(max_tokens=4, seed=666, n=2))
    finals = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
    bad = finals["bad"]
    assert [c.finish_reason for c in bad.outputs] == ["error", "error"]
    assert bad.error.startswith("sampling failed for this request: its logits became NaN")
    assert all(len(c.token_ids) == 1 for c in bad.outputs)  # the first token was fine
    for i in range(2):
        assert finals[f"g{i}"].outputs[0].token_ids == alone[i].outputs[0].token_ids
    assert engine.stats().num_kv_blocks_used == 0


def test_max_tokens_beyond_the_context_left_is_refused_naming_both_numbers(parts):
    engine = make_engine(parts, max_model_len=64)
    num_prompt = len(engine.tokenizer.encode(PROMPTS[0]))
    with pytest.raises(RequestError, match=rf"max_tokens is 100.* {num_prompt} tokens.* max_model_len is 64"):
        engine.add_request("r", PROMPTS[0], SamplingParams(max_tokens=100))
    engine.add_request("ok", PROMPTS[0], SamplingParams(max_tokens=64 - num_prompt))
    engine.abort_request("ok")
    assert engine.step()[0].finished


def test_the_loop_imports_neither_kernels_nor_parallel():
    import ast
    import inspect

    from inferpath.engine import llm_engine

    tree = ast.parse(inspect.getsource(llm_engine))
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names]
    assert not [m for m in imported if m and m.startswith(("inferpath.kernels", "inferpath.parallel"))]


def test_outputs_hand_out_prefixes_not_copies(parts):
    """Each step's output reads as the cumulative state at that step, although the engine
    copies no token or logprob list (it hands out prefixes of append-only lists)."""
    engine = make_engine(parts)
    _, every = run(engine, PROMPTS[:1], SamplingParams(max_tokens=6, temperature=0, logprobs=2))
    seen: list[int] = []
    for output in every:
        completion = output.outputs[0]
        seen += completion.delta_token_ids
        assert completion.token_ids == seen
        assert [lp.token_id for lp in completion.logprobs] == seen
