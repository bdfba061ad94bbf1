"""Scheduler on hand-built requests, with a fake model; no torch, no tokenizer.

The fake model's next token is a function of the whole context, so a request that is
preempted and recomputed must produce exactly the tokens it produces alone.
"""

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferpath.cache.blocks import BlockManager
from inferpath.engine.errors import RequestError
from inferpath.engine.output_processor import OutputProcessor, SampleText
from inferpath.engine.outputs import RunnerOutput
from inferpath.engine.request import Request, RequestStatus
from inferpath.engine.scheduler import Scheduler
from inferpath.sampling.params import SamplingParams

BS = 4


def make_scheduler(num_blocks=64, max_num_seqs=8, budget=64, max_model_len=256, prefix=True):
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=prefix)
    return Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                     max_model_len=max_model_len)


def make_request(rid, prompt, max_tokens=4, **kw):
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, **kw))


def fake_next_token(tokens):
    return (sum(t * (i + 1) for i, t in enumerate(tokens)) % 97) + 3


def step(sched):
    """schedule -> fake execute -> update; returns the SchedulerOutput."""
    out = sched.schedule()
    sampled = [fake_next_token(c.request.all_token_ids[:c.end]) for c in out.chunks if c.samples]
    sched.update(out, RunnerOutput(sampled))
    return out


def run_to_completion(sched, max_steps=500):
    outputs = []
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            return outputs
        outputs.append(step(sched))
    raise AssertionError("scheduler did not finish")


def alone(prompt, max_tokens):
    sched = make_scheduler()
    r = make_request("solo", prompt, max_tokens)
    sched.add_request(r)
    run_to_completion(sched)
    return r.output_token_ids


def test_scheduler_imports_no_torch():
    code = "import sys, inferpath.engine.scheduler; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_budget_chunks_prefill_and_decodes_go_first():
    sched = make_scheduler(budget=16)
    reqs = [make_request(f"r{i}", list(range(1 + i, 11 + i))) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    out = sched.schedule()
    assert [(c.request.request_id, c.num_new_tokens) for c in out.chunks] == [("r0", 10), ("r1", 6)]
    assert [c.samples for c in out.chunks] == [True, False]  # r1's chunk ends mid-prompt
    sched.update(out, RunnerOutput([fake_next_token(reqs[0].all_token_ids)]))
    out = sched.schedule()
    # r0 decodes first, then r1's rest of prompt, then r2 within what is left (16-1-4)
    assert [(c.request.request_id, c.num_new_tokens) for c in out.chunks] == [
        ("r0", 1), ("r1", 4), ("r2", 10)]
    assert out.num_batched_tokens == 15


def test_decodes_are_scheduled_before_partial_prefills():
    sched = make_scheduler(budget=8)
    long_req = make_request("long", list(range(1, 30)))
    short_req = make_request("short", [5, 6])
    sched.add_request(long_req)
    step(sched)  # long: 8 of 29 prompt tokens
    sched.add_request(short_req)
    step(sched)  # long: 8 more; short waits (budget spent)
    assert short_req.status is RequestStatus.WAITING
    step(sched)  # long: 8 more (24), no room
    out = step(sched)  # long: last 5; short: prompt of 2 and samples
    assert [(c.request.request_id, c.num_new_tokens) for c in out.chunks] == [("long", 5), ("short", 2)]
    out = sched.schedule()
    assert [c.request.request_id for c in out.chunks] == ["long", "short"]
    assert all(c.num_new_tokens == 1 for c in out.chunks)


def test_max_num_seqs_limits_running_and_new_requests_join_next_step():
    sched = make_scheduler(max_num_seqs=2)
    reqs = [make_request(f"r{i}", [i + 1] * 3, max_tokens=2) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    out = step(sched)
    assert len(out.chunks) == 2 and len(sched.running) == 2 and len(sched.waiting) == 1
    late = make_request("late", [9, 9])
    sched.add_request(late)
    out = step(sched)  # r0, r1 finish (max_tokens=2) at the end of this step
    assert [c.request.request_id for c in out.chunks] == ["r0", "r1"]
    out = step(sched)
    assert [c.request.request_id for c in out.chunks] == ["r2", "late"]


def test_chunked_prefill_gives_the_same_tokens():
    prompt = list(range(7, 40))
    expected = alone(prompt, 6)
    sched = make_scheduler(budget=5)
    r = make_request("r", prompt, 6)
    sched.add_request(r)
    outs = run_to_completion(sched)
    assert r.output_token_ids == expected
    assert max(o.num_batched_tokens for o in outs) <= 5


def test_preempts_newest_by_recompute_and_output_is_unchanged():
    prompts = {f"r{i}": [i + 1] * 6 for i in range(3)}
    expected = {rid: alone(p, 12) for rid, p in prompts.items()}
    # 3 requests of 6 + 12 tokens need 3 x 5 blocks of 4; 10 blocks force preemption
    sched = make_scheduler(num_blocks=10, prefix=False)
    reqs = [make_request(rid, p, 12) for rid, p in prompts.items()]
    for r in reqs:
        sched.add_request(r)
    preempted = []
    for _ in range(200):
        if not sched.has_unfinished_requests():
            break
        out = step(sched)
        preempted += [r.request_id for r in out.preempted]
        assert sched.block_manager.usage().num_used_blocks <= 10
    assert preempted and preempted[0] == "r2"  # the newest goes first
    assert sched.stats.num_preemptions == len(preempted)
    for r in reqs:
        assert r.status is RequestStatus.FINISHED_LENGTH
        assert r.output_token_ids == expected[r.request_id]
    assert sched.block_manager.usage().num_used_blocks == 0


def test_preempted_request_goes_to_the_front_of_the_queue():
    sched = make_scheduler(num_blocks=4, max_num_seqs=2, prefix=False)
    a, b = make_request("a", [1] * 4, 8), make_request("b", [2] * 4, 8)
    c = make_request("c", [3] * 4, 8)
    for r in (a, b, c):
        sched.add_request(r)
    for _ in range(20):
        out = step(sched)
        if out.preempted:
            break
    assert [r.request_id for r in out.preempted] == ["b"]
    assert [r.request_id for r in sched.waiting] == ["b", "c"]
    assert b.num_computed_tokens == 0 and not sched.block_manager.has_blocks(b.seq_id)


def test_prefix_hit_computes_only_the_unshared_tokens():
    shared = list(range(50, 66))  # 4 full blocks
    sched = make_scheduler()
    first = make_request("first", shared + [1, 2, 3])
    sched.add_request(first)
    step(sched)
    second = make_request("second", shared + [7, 8])
    sched.add_request(second)
    out = sched.schedule()
    chunk = next(c for c in out.chunks if c.request is second)
    assert (chunk.start, chunk.num_new_tokens) == (16, 2)
    assert second.num_cached_tokens == 16
    assert sched.stats.prefix_cache_queries == 19 + 18 and sched.stats.prefix_cache_hits == 16


def test_prompt_longer_than_max_model_len_is_rejected_naming_both_numbers():
    sched = make_scheduler(max_model_len=32)
    with pytest.raises(RequestError, match=r"40 tokens.*max_model_len is 32"):
        sched.check_request(40)
    with pytest.raises(RequestError, match="empty"):
        sched.check_request(0)


def test_prompt_that_can_never_fit_in_the_cache_is_rejected():
    sched = make_scheduler(num_blocks=5, max_model_len=1000)
    with pytest.raises(RequestError, match=r"30 tokens.*holds only 20 tokens"):
        sched.check_request(30)
    assert not sched.has_unfinished_requests()


def test_alone_and_out_of_blocks_finishes_with_length():
    sched = make_scheduler(num_blocks=2, max_model_len=1000)
    r = make_request("r", [1] * 5, max_tokens=100)
    sched.add_request(r)
    run_to_completion(sched)
    assert r.status is RequestStatus.FINISHED_LENGTH and r.num_tokens == 9  # 2 blocks of 4 + 1
    assert sched.block_manager.usage().num_used_blocks == 0


def test_abort_frees_blocks_at_the_next_step():
    sched = make_scheduler()
    a, b = make_request("a", [1] * 9, 50), make_request("b", [2] * 3, 50)
    sched.add_request(a)
    sched.add_request(b)
    step(sched)
    sched.abort([a.seq_id, b.seq_id])
    assert sched.block_manager.usage().num_used_blocks > 0  # not yet
    out = step(sched)
    assert {r.request_id for r in out.finished} == {"a", "b"}
    assert a.finish_reason == "abort" and out.chunks == []
    assert sched.block_manager.usage().num_used_blocks == 0 and not sched.has_unfinished_requests()


def test_max_tokens_and_context_limit_finish_with_length():
    sched = make_scheduler(max_model_len=10)
    capped = make_request("capped", [1] * 8, max_tokens=None)
    short = make_request("short", [1] * 3, max_tokens=2)
    sched.add_request(capped)
    sched.add_request(short)
    run_to_completion(sched)
    assert capped.num_tokens == 10 and capped.finish_reason == "length"
    assert short.num_output_tokens == 2 and short.finish_reason == "length"


def test_eos_and_stop_token_ids_finish_with_stop():
    prompt = [4, 5, 6]
    first = fake_next_token(prompt)
    sched = make_scheduler()
    eos = Request("eos", prompt, SamplingParams(max_tokens=9), eos_token_ids=frozenset({first}))
    ignore = Request("ignore", prompt, SamplingParams(max_tokens=3, ignore_eos=True),
                     eos_token_ids=frozenset({first}))
    stop_id = Request("stop_id", prompt, SamplingParams(max_tokens=9, stop_token_ids=[first]))
    for r in (eos, ignore, stop_id):
        sched.add_request(r)
    run_to_completion(sched)
    assert eos.output_token_ids == [first] and eos.finish_reason == "stop" and eos.stop_reason is None
    assert ignore.num_output_tokens == 3 and ignore.finish_reason == "length"
    assert stop_id.finish_reason == "stop" and stop_id.stop_reason == first


class CharDetokenizer:
    """Token id i is the character chr(i)."""

    def add(self, token_id):
        return chr(token_id)

    def flush(self):
        return ""


def run_tokens(params, tokens, prompt=(1,)):
    """Feed ``tokens`` one step at a time through scheduler and output processor (as the
    engine's step does); yields (request, sample text, text delta) after each."""
    sched = make_scheduler()
    processor = OutputProcessor()
    r = Request("r", list(prompt), params)
    text = SampleText(r, CharDetokenizer())
    processor.add(text)
    sched.add_request(r)
    for token in tokens:
        out = sched.schedule()
        updates = sched.update(out, RunnerOutput([token]))
        sched.finish_requests(processor.process(updates))
        yield r, text, text.take_delta()[0]
        if r.status.is_finished:
            return


def test_stop_string_across_tokens_is_cut_and_never_streamed():
    params = SamplingParams(max_tokens=20, stop=["STOP"])
    steps = list(run_tokens(params, [ord(c) for c in "abSTOPzz"]))
    deltas = [d for _, _, d in steps]
    assert deltas == ["a", "b", "", "", "", ""]  # "ST..." is held back: it could start "STOP"
    r, text, _ = steps[-1]
    assert r.finish_reason == "stop" and r.stop_reason == "STOP"
    assert text.text == "ab"
    assert r.num_output_tokens == 6  # the tokens stay; only the text is cut


def test_held_back_text_is_released_when_it_does_not_stop():
    params = SamplingParams(max_tokens=3, stop=["xyz"])
    steps = list(run_tokens(params, [ord("a"), ord("x"), ord("b")]))
    assert [d for _, _, d in steps] == ["a", "", "xb"]  # max_tokens: "x" and "b" released
    assert steps[-1][0].finish_reason == "length"


def test_stop_string_in_the_last_token_outranks_length():
    """max_tokens ends the request with the token that completes a stop string: the text
    shows the stop string, so the request reports it (as a stream would have)."""
    params = SamplingParams(max_tokens=3, stop=["ab"])
    r, text, _ = list(run_tokens(params, [ord("x"), ord("a"), ord("b")]))[-1]
    assert (r.finish_reason, r.stop_reason, text.text) == ("stop", "ab", "x")


def test_min_tokens_never_carries_a_request_past_max_model_len():
    sched = make_scheduler(max_model_len=8)
    eos = 5
    r = Request("r", [1, 2, 3], SamplingParams(max_tokens=None, min_tokens=0, ignore_eos=False),
                eos_token_ids=frozenset({eos}))
    long = Request("long", [1, 2, 3], SamplingParams(max_tokens=None, min_tokens=5))
    sched.add_request(r)
    sched.add_request(long)
    for _ in range(10):
        out = sched.schedule()
        if out.is_empty:
            break
        sched.update(out, RunnerOutput([7] * sum(c.samples for c in out.chunks)))
    assert long.num_tokens == 8 and long.finish_reason == "length"
    assert sched.block_manager.usage().num_used_blocks == 0


def test_max_tokens_or_min_tokens_beyond_the_context_left_are_refused():
    sched = make_scheduler(max_model_len=100)
    sched.check_request(40, 60, 0)  # exactly fits
    with pytest.raises(RequestError, match=r"max_tokens is 61.* 40 tokens.* max_model_len is 100.* at most 60") as info:
        sched.check_request(40, 61)
    assert info.value.param == "max_tokens"
    with pytest.raises(RequestError, match="min_tokens is 70") as info:
        sched.check_request(40, None, 70)
    assert info.value.param == "min_tokens"


def test_a_row_error_fails_that_request_alone():
    sched = make_scheduler()
    a, b = make_request("a", [1, 2, 3], 4), make_request("b", [4, 5, 6], 4)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    updates = sched.update(out, RunnerOutput([0, 9], errors=["its logits became NaN", None]))
    assert a.finish_reason == "error" and a.error == "its logits became NaN" and not a.output_token_ids
    assert b.output_token_ids == [9] and b.status is RequestStatus.RUNNING
    assert [(u.request.request_id, u.token_id) for u in updates] == [("a", None), ("b", 9)]
    run_to_completion(sched)
    assert b.num_output_tokens == 4 and sched.block_manager.usage().num_used_blocks == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 12), st.integers(0, 3),
                          st.booleans()), min_size=1, max_size=8),
       st.integers(6, 24), st.integers(1, 40), st.booleans())
def test_random_workloads_finish_with_alone_outputs_and_free_every_block(
        specs, num_blocks, budget, prefix):
    """Arrivals over time, shared prefixes, aborts, a small cache and budget: every
    request that is not aborted gets exactly its alone output; no block leaks."""
    sched = make_scheduler(num_blocks=num_blocks, budget=budget, max_num_seqs=4,
                           max_model_len=200, prefix=prefix)
    pending = []
    for i, (length, max_tokens, arrival_step, abort) in enumerate(specs):
        prompt = ([7, 8, 9, 10] * 8)[:min(length, 12)] + [i + 1] * max(0, length - 12)
        if length + 1 > num_blocks * BS:
            continue
        pending.append((arrival_step, make_request(f"r{i}", prompt, max_tokens), abort))
    for step_index in range(400):
        for arrival_step, request, abort in pending:
            if arrival_step == step_index:
                sched.add_request(request)
            if abort and arrival_step + 2 == step_index:
                sched.abort([request.seq_id])
        if step_index > 5 and not sched.has_unfinished_requests():
            break
        step(sched)
    assert not sched.has_unfinished_requests()
    for _, request, abort in pending:
        if request.finish_reason == "abort":
            assert abort
            continue
        expected = alone(request.prompt_token_ids, request.params.max_tokens)
        if request.finish_reason == "length" and request.num_output_tokens < len(expected):
            # alone and out of blocks: only possible when the cache cannot hold it whole
            assert request.num_tokens > num_blocks * BS
            expected = expected[:request.num_output_tokens]
        assert request.output_token_ids == expected
    assert sched.block_manager.usage().num_used_blocks == 0
