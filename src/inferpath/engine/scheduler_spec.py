"""The scheduler's side of speculative decoding: drafts in, verified runs out. Imports no torch.

Speculative decoding (engine/spec/) is a chunk too: a decoding request holding k drafted
tokens (``request.spec_token_ids``, proposed after the previous step) is scheduled as a
chunk of 1 + k tokens, its last real token and the drafts, with slots for all of them.
Drafts that do not fit the token budget or the free blocks are cut (never a reason to
preempt): ``take_drafts``.

``Scheduler.update`` takes the verified run (sampling/rejection.py) through ``accept_run``:
the accepted drafts and one token of the target's own, appended one by one with every stop
checked after each (so EOS, a stop token or ``max_tokens`` inside a drafted run ends the
request there); the K/V of the rejected drafts is dropped by giving their slots back
(``trim``), and only blocks full of accepted tokens get prefix-cache hashes.
"""

from __future__ import annotations

from collections.abc import Callable

from inferpath.cache.blocks import BlockManager
from inferpath.engine.outputs import TokenRun
from inferpath.engine.request import Request
from inferpath.engine.scheduler_output import SampleUpdate, ScheduledChunk, SchedulerStats


def take_drafts(request: Request, budget: int, max_model_len: int,
                block_manager: BlockManager) -> tuple[int, ...]:
    """The request's drafted tokens to verify this step (taken: they are proposed anew
    after each step), cut to the token budget, the context limit and the free blocks."""
    drafts, request.spec_token_ids = request.spec_token_ids, []
    if not drafts or request.num_tokens - request.num_computed_tokens != 1:
        request.spec_draft_probs = None
        return ()
    num_drafts = min(len(drafts), budget - 1, max_model_len - request.num_tokens)
    while num_drafts > 0 and not block_manager.can_append_slots(request.seq_id,
                                                                request.num_tokens + num_drafts):
        num_drafts -= 1
    return tuple(drafts[:max(num_drafts, 0)])


def accept_run(chunk: ScheduledChunk, run: TokenRun, block_manager: BlockManager,
               stats: SchedulerStats, check_stop: Callable[[Request, int], None]) -> list[SampleUpdate]:
    """Take a verified speculative run (engine/outputs.py TokenRun): hash the blocks
    full of accepted tokens, append the tokens one by one until one stops the request
    (``check_stop``, the scheduler's: it finishes the request), and give back the slots
    of the rejected drafts. Returns an update per token appended."""
    request = chunk.request
    num_drafted, num_accepted = len(chunk.draft_token_ids), run.num_accepted
    stats.num_spec_drafts += 1
    stats.num_spec_draft_tokens += num_drafted
    stats.num_spec_accepted_tokens += num_accepted
    per_pos = stats.spec_accepted_per_pos
    per_pos.extend([0] * (num_drafted - len(per_pos)))
    for pos in range(num_accepted):
        per_pos[pos] += 1
    if request.spec_acceptance is not None:
        request.spec_acceptance.observe(num_drafted, num_accepted)
    # K/V is valid through the last real token and the accepted drafts
    num_computed = chunk.start + 1 + num_accepted
    block_manager.cache_full_blocks(
        request.seq_id, request.all_token_ids + run.token_ids[:num_accepted], num_computed)
    updates = []
    for j, token_id in enumerate(run.token_ids):
        request.append_output(token_id)
        stats.num_generation_tokens += 1
        check_stop(request, token_id)
        is_last = request.status.is_finished or j == len(run.token_ids) - 1
        updates.append(SampleUpdate(request, token_id, run.logprobs[j], is_last))
        if request.status.is_finished:
            break
    request.num_computed_tokens = min(num_computed, request.num_tokens - 1)
    if not request.status.is_finished:
        block_manager.trim(request.seq_id, request.num_tokens)
    return updates
