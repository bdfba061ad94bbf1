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

Speculative decoding is a chunk too: a decoding request's k drafted tokens are scheduled
with its last real token as a chunk of 1 + k, and ``update`` appends the verified run with
every stop checked after each token (engine/scheduler_spec.py).

The hand-offs (``SchedulerOutput`` of ``ScheduledChunk``s, ``SampleUpdate``,
``SchedulerStats``) are engine/scheduler_output.py's, re-exported here.

Invariants:
- a request is in exactly one of ``waiting`` / ``running``, or finished and in neither;
- a running request holds blocks for at least its ``num_computed_tokens`` tokens;
- a waiting request holds no blocks;
- a request that is running always has at least one token left to compute.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from inferpath.cache.blocks import BlockManager
from inferpath.engine.errors import RequestError
from inferpath.engine.outputs import RunnerOutput
from inferpath.engine.request import Request, RequestStatus
from inferpath.engine.scheduler_output import SampleUpdate, ScheduledChunk, SchedulerOutput, SchedulerStats
from inferpath.engine.scheduler_spec import accept_run, take_drafts
from inferpath.sampling.stop import check_stop


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
            drafts = take_drafts(request, budget, self.max_model_len, self.block_manager)
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
                updates += accept_run(chunk, run, self.block_manager, self.stats, self._check_stop)
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
