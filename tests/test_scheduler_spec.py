"""The scheduler's side of speculative decoding on hand-built requests; no torch.

A fake verifier (the fake model of test_scheduler.py accepts a draft when it is the
token the model would choose there) checks the bookkeeping against decoding without
drafts: the same tokens, ``num_computed_tokens`` through the accepted drafts only, the
rejected drafts' blocks given back, prefix hashes only for blocks of accepted tokens,
and ``max_tokens`` / a stop token inside a drafted run ending the request at that token.
"""

import random

from test_scheduler import fake_next_token, make_request, make_scheduler, run_to_completion

from inferpath.engine.outputs import RunnerOutput, TokenRun
from inferpath.engine.scheduler import SampleUpdate


def verify(out):
    """What a greedy verifier emits for each sampling chunk, with the fake model."""
    tokens, runs = [], {}
    for i, chunk in enumerate(c for c in out.chunks if c.samples):
        context = chunk.request.all_token_ids[:chunk.end - len(chunk.draft_token_ids)]
        emitted = [fake_next_token(context)]
        for draft in chunk.draft_token_ids:
            if emitted[-1] != draft:
                break
            context = context + [draft]
            emitted.append(fake_next_token(context))
        tokens.append(emitted[0])
        if chunk.draft_token_ids:
            runs[i] = TokenRun(emitted, [None] * len(emitted), len(chunk.draft_token_ids))
    return RunnerOutput(tokens, runs=runs)


def run_with_drafts(sched, rng, k=3, max_steps=500):
    """Each step: drafts for every decoding request (some right, some wrong), verify, update."""
    updates: list[SampleUpdate] = []
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            return updates
        for r in sched.running:
            if r.num_tokens - r.num_computed_tokens == 1 and rng.random() < 0.8:
                context, drafts = list(r.all_token_ids), []
                for _ in range(k):
                    token = fake_next_token(context) if rng.random() < 0.7 else 1
                    drafts.append(token)
                    context.append(token)
                r.spec_token_ids = drafts
        out = sched.schedule()
        updates += sched.update(out, verify(out))
        bm = sched.block_manager
        for r in sched.running:  # never more blocks than the tokens need
            assert len(bm.block_table(r.seq_id)) <= bm.num_blocks_for(r.num_tokens)
            assert r.num_computed_tokens < r.num_tokens
    raise AssertionError("scheduler did not finish")


def plain_outputs(prompts, max_tokens, **kw):
    sched = make_scheduler(**kw)
    requests = [make_request(f"r{i}", p, max_tokens) for i, p in enumerate(prompts)]
    for r in requests:
        sched.add_request(r)
    run_to_completion(sched)
    return [r.output_token_ids for r in requests]


def test_drafted_runs_give_the_plain_tokens_and_return_every_block():
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 90) for _ in range(rng.randint(1, 13))] for _ in range(12)]
    for kw in ({}, {"num_blocks": 12, "budget": 9}):  # roomy; then preemption and chunking
        sched = make_scheduler(**kw)
        requests = [make_request(f"r{i}", p, 9) for i, p in enumerate(prompts)]
        for r in requests:
            sched.add_request(r)
        run_with_drafts(sched, rng)
        assert [r.output_token_ids for r in requests] == plain_outputs(prompts, 9, **kw)
        assert sched.stats.num_spec_accepted_tokens > 0
        assert sched.stats.num_spec_accepted_tokens < sched.stats.num_spec_draft_tokens
        assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks


def test_only_blocks_of_accepted_tokens_are_hashed():
    sched = make_scheduler()
    r = make_request("r", [5, 6, 7], max_tokens=20)
    sched.add_request(r)
    sched.update(out := sched.schedule(), verify(out))  # prefill: 4 tokens, one block
    right = fake_next_token(r.all_token_ids)
    r.spec_token_ids = [right, 1, 1, 1, 1, 1]  # one accepted, then wrong drafts
    out = sched.schedule()
    assert out.chunks[0].num_new_tokens == 7 and len(sched.block_manager.block_table(r.seq_id)) == 3
    sched.update(out, verify(out))
    assert r.num_tokens == 6 and r.num_computed_tokens == 5
    bm = sched.block_manager
    assert len(bm.block_table(r.seq_id)) == 2  # the rejected drafts' third block given back
    assert len(bm._seq_hashes[r.seq_id]) == 1  # block 2 holds a drafted token not yet computed


def test_max_tokens_and_stop_tokens_inside_a_drafted_run():
    for params, expected_len in (({"max_tokens": 3}, 3), ({"max_tokens": 10}, None)):
        sched = make_scheduler()
        r = make_request("r", [8, 9], **params)
        sched.add_request(r)
        sched.update(out := sched.schedule(), verify(out))
        context, drafts = list(r.all_token_ids), []
        for _ in range(6):
            drafts.append(fake_next_token(context))
            context.append(drafts[-1])
        if expected_len is None:  # a stop token at the third drafted position
            r.params = r.params.__class__(max_tokens=10, stop_token_ids=[drafts[2]])
            expected_len = 1 + 3
        r.spec_token_ids = drafts
        out = sched.schedule()
        updates = sched.update(out, verify(out))
        assert r.status.is_finished and r.num_output_tokens == expected_len
        assert [u.is_last for u in updates] == [False] * (len(updates) - 1) + [True]
        assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks
