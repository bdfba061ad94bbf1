"""Scheduler: which tokens of which requests to compute in the next step. Imports no torch.

Schedule tokens, not phases. A request is a list of tokens of which the first
``num_computed_tokens`` have their K/V in the cache; each step computes some more of
them. A prompt of 7 tokens is a chunk of 7, a decode is a chunk of 1, a long prompt is
several chunks over several steps (chunked prefill). One token budget,
``max_num_batched_tokens``, bounds the step:

1. running requests first, decodes before partial prefills, oldest first;
2. then waiting requests, front of the queue first, up to ``max_num_seqs`` running,
   each starting from its longest cached prefix (automatic prefix caching).

The scheduler owns every condition that ends a request: EOS and stop token ids,
``max_tokens``, ``max_model_len``, abort, a request's own sampling failure, and (asked by
the output processor, which reads the text) stop strings. ``update`` takes the
runner's output whole and returns one ``SampleUpdate`` per request it advanced.

When the block manager runs out of blocks for a running request, the newest running
request is preempted by recompute: its blocks are freed and it goes back to the front of
the waiting queue, keeping its output tokens. On resume the prompt *and* its output so far
are prefilled again (mostly prefix-cache hits), so its output is unchanged.

Speculative decoding (engine/spec/) is a chunk too: a decoding request holding k drafted
tokens (``request.spec_token_ids``, proposed after the previous step) is scheduled as a
chunk of 1 + k tokens, its last real token and the drafts, with slots for all of them.
``update`` takes the verified run (sampling/rejection.py): the accepted drafts and one
token of the target's own, appended one by one with every stop checked after each (so
EOS, a stop token or ``max_tokens`` inside a drafted run ends the request there); the
K/V of the rejected drafts is dropped by giving their slots back (``trim``), and only
blocks full of accepted tokens get prefix-cache hashes. Drafts that do not fit the
token budget or the free blocks are cut (never a reason to preempt).

Invariants:
- a request is in exactly one of ``waiting`` / ``running``, or finished and in neither;
- a running request holds blocks for at least its ``num_computed_tokens`` tokens;
- a waiting request holds no blocks;
- a request that is running always has at least one token left to compute.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from inferpath.cache.blocks import BlockManager
from inferpath.engine.errors import RequestError
from inferpath.engine.outputs import RunnerOutput
from inferpath.engine.request import Request, RequestStatus
from inferpath.sampling.stop import check_stop


@dataclass(frozen=True)
class ScheduledChunk:
    """Compute the tokens at positions [start, end) of ``request``.

    ``start`` is the request's ``num_computed_tokens`` when scheduled. ``samples`` is
    True when the chunk reaches the request's last token: its logits are sampled.
    ``draft_token_ids`` (speculative decoding) are the last ``len(draft_token_ids)`` of
    the ``num_new_tokens``: drafted tokens past the request's last one, to verify.
    """

    request: Request
    start: int
    num_new_tokens: int
    samples: bool
    draft_token_ids: tuple[int, ...] = ()

    @classmethod
    def of(cls, request: Request, num_new_tokens: int,
           draft_token_ids: tuple[int, ...] = ()) -> ScheduledChunk:
        start = request.num_computed_tokens
        samples = start + num_new_tokens - len(draft_token_ids) == request.num_tokens
        return cls(request, start, num_new_tokens, samples, draft_token_ids)

    @property
    def end(self) -> int:
        return self.start + self.num_new_tokens


@dataclass
class SchedulerOutput:
    """One step's work, in batch order (decodes first). Read by the runner."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # requests finished by the scheduler itself (aborted, or out of cache when alone)
    finished: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass
class SampleUpdate:
    """What one step did to one request: the token it got (or None: it finished without
    one, e.g. aborted or failed) and that token's logprobs. Read by the output processor."""

    request: Request
    token_id: int | None = None
    logprobs: object = None
    # False for all but the last of several tokens one step gave a request (a verified
    # speculative run): the output processor flushes a finished request's text only at its last
    is_last: bool = True


@dataclass
class SchedulerStats:
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up at first admission
    prefix_cache_hits: int = 0  # of which found in the cache
    num_prompt_tokens_computed: int = 0  # prompt tokens actually run through the model
    num_generation_tokens: int = 0
    # speculative decoding: verified chunks, their drafted tokens, the accepted ones, and
    # accepted counts by draft position (vLLM's spec_decode metrics)
    num_spec_drafts: int = 0
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)


class Scheduler:
    """Continuous batching over a token budget, with chunked prefill and preemption."""

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = SchedulerStats()
        self._to_abort: set = set()

    # ------------------------------------------------------------------ intake
    def check_request(self, num_prompt_tokens: int, max_tokens: int | None = None,
                      min_tokens: int = 0) -> None:
        """Raise RequestError for a request that could never run as asked: an empty
        prompt, one that leaves no room to generate or does not fit in the cache, or
        ``max_tokens`` / ``min_tokens`` beyond the context left after the prompt."""
        if num_prompt_tokens == 0:
            raise RequestError("the prompt is empty; it needs at least one token")
        if num_prompt_tokens >= self.max_model_len:
            raise RequestError(
                f"the prompt has {num_prompt_tokens} tokens, but max_model_len is "
                f"{self.max_model_len} and at least one token must be left to generate; "
                "shorten the prompt")
        bm = self.block_manager
        num_capacity = bm.num_blocks * bm.block_size
        if num_prompt_tokens + 1 > num_capacity:
            raise RequestError(
                f"the prompt has {num_prompt_tokens} tokens, but the KV cache holds only "
                f"{num_capacity} tokens ({bm.num_blocks} blocks of {bm.block_size}); "
                "shorten the prompt or give the cache more memory")
        num_left = self.max_model_len - num_prompt_tokens
        for name, value in (("max_tokens", max_tokens), ("min_tokens", min_tokens)):
            if value is not None and value > num_left:
                raise RequestError(
                    f"{name} is {value}, but the prompt has {num_prompt_tokens} tokens and "
                    f"max_model_len is {self.max_model_len}: at most {num_left} tokens can "
                    f"be generated; lower {name} or shorten the prompt", param=name)

    def add_request(self, request: Request) -> None:
        """Queue a request; the caller has checked it once with ``check_request``."""
        request.max_model_len = self.max_model_len
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def abort(self, seq_ids: Iterable) -> None:
        """Mark requests to be aborted (their blocks freed) at the next ``schedule``."""
        self._to_abort.update(seq_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self._to_abort:
            out.finished.extend(self._apply_aborts())
        budget = self.max_num_batched_tokens
        scheduled: dict[object, ScheduledChunk] = {}
        # decodes first, then partial prefills; oldest first within each
        order = ([r for r in self.running if r.num_tokens - r.num_computed_tokens == 1]
                 + [r for r in self.running if r.num_tokens - r.num_computed_tokens > 1])
        for request in order:
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            if self._outgrew_cache(request):
                out.finished.append(request)
                continue
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            drafts = self._drafts_that_fit(request, budget)
            num_new += len(drafts)
            num_slots = request.num_computed_tokens + num_new
            while not self.block_manager.can_append_slots(request.seq_id, num_slots):
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim)
                if victim.seq_id in scheduled:
                    budget += scheduled.pop(victim.seq_id).num_new_tokens
                if victim is request:
                    break
            else:
                self.block_manager.append_slots(request.seq_id, num_slots)
                scheduled[request.seq_id] = ScheduledChunk.of(request, num_new, drafts)
                budget -= num_new

        if not out.preempted:
            budget = self._admit_waiting(scheduled, budget, out.finished)
        out.chunks = list(scheduled.values())
        return out

    def _drafts_that_fit(self, request: Request, budget: int) -> tuple[int, ...]:
        """The request's drafted tokens to verify this step (taken: they are proposed anew
        after each step), cut to the token budget, the context limit and the free blocks."""
        drafts, request.spec_token_ids = request.spec_token_ids, []
        if not drafts or request.num_tokens - request.num_computed_tokens != 1:
            request.spec_draft_probs = None
            return ()
        num_drafts = min(len(drafts), budget - 1, self.max_model_len - request.num_tokens)
        bm = self.block_manager
        while num_drafts > 0 and not bm.can_append_slots(request.seq_id, request.num_tokens + num_drafts):
            num_drafts -= 1
        return tuple(drafts[:max(num_drafts, 0)])

    def _admit_waiting(self, scheduled: dict[object, ScheduledChunk], budget: int,
                       scheduled_finished: list[Request]) -> int:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if self._outgrew_cache(request):
                scheduled_finished.append(request)
                continue
            # prompt logprobs need every prompt position computed (engine/prompt_logprobs.py)
            # batch-invariant rows' blocks hash apart (their K/V were computed another way)
            namespace = int(request.row_invariant)
            cached = ([] if request.prompt_logprobs is not None
                      and len(request.prompt_logprobs) < request.num_prompt_tokens
                      else bm.find_cached_prefix(request.all_token_ids, namespace))
            num_computed = len(cached) * bm.block_size
            num_new = min(request.num_tokens - num_computed, budget)
            if not bm.can_allocate(num_computed + num_new, cached):
                break  # the queue is FIFO: nobody overtakes the head
            bm.allocate(request.seq_id, num_computed + num_new, cached, namespace)
            if request.status is RequestStatus.WAITING:  # first admission, not a resume
                request.num_cached_tokens = num_computed
                self.stats.prefix_cache_queries += request.num_prompt_tokens
                self.stats.prefix_cache_hits += num_computed
            request.num_computed_tokens = num_computed
            request.status = RequestStatus.RUNNING
            self.waiting.popleft()
            self.running.append(request)
            scheduled[request.seq_id] = ScheduledChunk.of(request, num_new)
            budget -= num_new
        return budget

    # ------------------------------------------------------------------ update
    def update(self, output: SchedulerOutput, runner_output: RunnerOutput) -> list[SampleUpdate]:
        """Advance each scheduled request; give each chunk that samples its token (in
        chunk order) and end the request if that token stops it; fail alone a request
        whose row could not be sampled. Returns an update per request that got a token
        or finished, including ``output.finished``."""
        updates = [SampleUpdate(request) for request in output.finished]
        i = 0
        for chunk in output.chunks:
            request = chunk.request
            if request.num_computed_tokens < request.num_prompt_tokens:
                num_prompt_new = min(chunk.end, request.num_prompt_tokens) - chunk.start
                self.stats.num_prompt_tokens_computed += num_prompt_new
            run = runner_output.runs.get(i) if chunk.draft_token_ids and chunk.samples else None
            if run is not None:
                self._accept_run(chunk, run, updates)
                i += 1
                continue
            request.num_computed_tokens = chunk.end - len(chunk.draft_token_ids)
            self.block_manager.cache_full_blocks(
                request.seq_id, request.all_token_ids, request.num_computed_tokens)
            if not chunk.samples:
                continue
            error = runner_output.error(i)
            if error is not None:
                request.error = error
                self._finish(request, RequestStatus.FINISHED_ERROR)
                updates.append(SampleUpdate(request))
            else:
                token_id = runner_output.token_ids[i]
                request.append_output(token_id)
                self.stats.num_generation_tokens += 1
                self._check_stop(request, token_id)
                updates.append(SampleUpdate(request, token_id, runner_output.logprob(i)))
            i += 1
        if i != len(runner_output.token_ids):
            raise ValueError(f"got {len(runner_output.token_ids)} sampled tokens for "
                             f"{i} sampling chunks")
        return updates

    def _accept_run(self, chunk: ScheduledChunk, run, updates: list[SampleUpdate]) -> None:
        """Take a verified speculative run (engine/outputs.py TokenRun): hash the blocks
        full of accepted tokens, append the tokens one by one until one stops the request,
        and give back the slots of the rejected drafts."""
        request = chunk.request
        num_drafted, num_accepted = len(chunk.draft_token_ids), run.num_accepted
        stats = self.stats
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
        self.block_manager.cache_full_blocks(
            request.seq_id, request.all_token_ids + run.token_ids[:num_accepted], num_computed)
        for j, token_id in enumerate(run.token_ids):
            request.append_output(token_id)
            stats.num_generation_tokens += 1
            self._check_stop(request, token_id)
            is_last = request.status.is_finished or j == len(run.token_ids) - 1
            updates.append(SampleUpdate(request, token_id, run.logprobs[j], is_last))
            if request.status.is_finished:
                break
        request.num_computed_tokens = min(num_computed, request.num_tokens - 1)
        if not request.status.is_finished:
            self.block_manager.trim(request.seq_id, request.num_tokens)

    def finish_requests(self, stopped: Iterable[tuple[Request, str]]) -> None:
        """End requests at a stop string (found by the output processor in their text)."""
        for request, stop_str in stopped:
            if not request.status.is_finished:
                self._finish(request, RequestStatus.FINISHED_STOPPED, stop_str)
            else:  # ended by its last token too: the stop string is what the text shows
                request.finish(RequestStatus.FINISHED_STOPPED, stop_str)

    def _check_stop(self, request: Request, token_id: int) -> None:
        stop = check_stop(token_id, request.num_output_tokens, request.params,
                          request.eos_token_ids, num_prompt_tokens=request.num_prompt_tokens,
                          max_model_len=request.max_model_len)
        if stop is not None:
            reason, stop_reason = stop
            self._finish(request, RequestStatus.FINISHED_STOPPED if reason == "stop"
                         else RequestStatus.FINISHED_LENGTH, stop_reason)

    # ------------------------------------------------------------------ helpers
    def _outgrew_cache(self, request: Request) -> bool:
        """Finish a request whose context no longer fits in the whole cache ("length").

        Only a request that grew while running can get there (prompts are checked on
        arrival); it could never be given blocks for its next token, even alone.
        """
        bm = self.block_manager
        if request.num_tokens <= bm.num_blocks * bm.block_size:
            return False
        self._finish(request, RequestStatus.FINISHED_LENGTH)
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.block_manager.free(request.seq_id)
        request.num_computed_tokens = 0
        request.spec_token_ids, request.spec_draft_probs = [], None
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.appendleft(request)

    def _remove_finished(self, request: Request) -> None:
        self.running.remove(request)
        self.block_manager.free(request.seq_id)

    def _finish(self, request: Request, status: RequestStatus,
                stop_reason: int | str | None = None) -> None:
        if request in self.running:
            self._remove_finished(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.finish(status, stop_reason)

    def _apply_aborts(self) -> list[Request]:
        aborted = []
        for request in [*self.running, *self.waiting]:
            if request.seq_id in self._to_abort:
                self._finish(request, RequestStatus.FINISHED_ABORTED)
                aborted.append(request)
        self._to_abort.clear()
        return aborted
