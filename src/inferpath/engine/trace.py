"""The engine's own trace: every step it runs, timed per stage, while someone asks for it.

Tracing observes the engine that serves (scheduler -> ModelRunner -> the model with its
native kernels and fused projections -> sampler); it never runs a second loop. It is off
by default and then nothing is attached: ``LLMEngine.tracer`` is None, the model carries
no timing wrapper and the runner its own sampler. While on (``with trace(engine) as tracer`` on
one thread, or ``acquire()``/``release()`` from a server handler), each step is executed
through ``StepTracer.execute``, which

- attaches the stage clock (trace_stages.py) and a sampler that keeps the logits, in the
  engine's thread, between steps;
- times ``runner.execute`` as the step and the clocked modules as its rows, or, for a
  step that ran the native decode call (which a traced step still takes), the call's own
  per-stage clock (``StepRecord.native_decode`` says which);
- records the batch (every chunk: request, positions, prefill or decode), the KV blocks
  in use after the step, and per sampled chunk the token drawn and the top candidates of
  the logits (probabilities at temperature 1), computed after the step's clock stopped;
- for an MoE model, which experts each layer's router chose (``experts_touched``).

Records are kept for the last ``max_steps`` steps and read by request id
(``steps_of``); a request's records show every step it took part in and how many other
sequences shared each one.

Invariant: the clock and the sampler are attached and removed only while holding ``_lock``,
which a traced step holds from start to end, so a step never sees half of them; the
number of holders and ``engine.tracer`` change only under ``_count_lock``, so a release
racing a new acquire never leaves the new holder untraced.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from inferpath.engine.trace_stages import StageClock, fusion_notes
from inferpath.explain.sampler_cost import row_kind

TOP_CANDIDATES = 5


@dataclass
class ChunkRecord:
    """One request's share of a step: positions [start, start + num_new_tokens)."""

    request_id: str
    index: int  # sample index within the request (n > 1)
    start: int
    num_new_tokens: int
    num_prompt_tokens: int
    token_id: int | None = None  # the token sampled at the chunk's end, if it sampled
    # the sampler's kind of work for this row (explain/sampler_cost.row_kind) if it sampled
    sampling_kind: str | None = None
    top_ids: list[int] = field(default_factory=list)
    top_probs: list[float] = field(default_factory=list)
    # speculative decoding: the drafts this chunk verified (the last len() of its tokens),
    # how many were accepted (the rest is the rejected tail), and every token it emitted
    draft_token_ids: list[int] = field(default_factory=list)
    num_accepted: int = 0
    emitted_token_ids: list[int] = field(default_factory=list)

    @property
    def is_prefill(self) -> bool:
        return self.start < self.num_prompt_tokens

    @property
    def context_len(self) -> int:
        """Tokens of this sequence in the KV cache after the step."""
        return self.start + self.num_new_tokens


@dataclass
class StepRecord:
    """One engine step: its wall time, its rows (trace_stages.py) and its batch."""

    index: int
    start_time: float  # time.monotonic() at the step's start
    step_s: float
    stages: dict[str, float]  # row -> seconds; sums to step_s ("other" is the remainder)
    chunks: list[ChunkRecord]
    num_kv_blocks_used: int
    num_kv_blocks_total: int
    # the step's layers ran in the native decode call, its rows from the call's own clock
    # (trace_stages.py); False: the module path, its rows from the module wrappers
    native_decode: bool = False
    # an MoE model's routing: {layer: {expert: tokens of this step routed to it}}, the experts
    # each MoE layer's router chose over the step's tokens (engine/trace_experts.py); {} else
    experts_touched: dict[int, dict[int, int]] = field(default_factory=dict)

    @property
    def num_experts_touched(self) -> dict[int, int]:
        """{layer: distinct experts its router chose in this step}."""
        return {layer: len(experts) for layer, experts in self.experts_touched.items()}

    @property
    def num_seqs(self) -> int:
        return len(self.chunks)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks if c.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks if not c.is_prefill)

    def chunk_of(self, request_id: str) -> ChunkRecord | None:
        return next((c for c in self.chunks if c.request_id == request_id), None)


CANDIDATE_CHUNK = 192  # logits a chunk when looking for the top candidates
_OFFSETS = torch.arange(CANDIDATE_CHUNK)  # (chunk,): a chunk's columns from its first


def top_candidates(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities at temperature 1, ids) of each row's ``k`` largest logits, both
    (rows, k), largest first: ``logits.softmax(-1).topk(k)`` at half its cost (a ``topk``
    over a 49,152-token vocabulary costs twice the softmax: SmolLM2, one thread, 8 rows
    0.32 ms against 0.70, one row 0.07 against 0.12; inside a traced decode step, after the
    weights streamed through the caches, one row's took ~0.5 ms more than the chunks').

    logits: (rows, vocab). The k largest of a row lie in the k chunks of ``CANDIDATE_CHUNK``
    logits with the largest maxima (each of them is at least the k-th largest, and at most
    k chunks hold one), so the ``topk`` runs over those chunks and the tail past the last
    whole chunk; one softmax gives the probabilities at the ids found.
    """
    logits = logits.float()
    rows, vocab = logits.shape
    num_chunks = vocab // CANDIDATE_CHUNK
    if num_chunks < 2 * k:
        ids = logits.topk(k, dim=-1).indices
    else:
        whole = num_chunks * CANDIDATE_CHUNK
        maxima = logits[:, :whole].view(rows, num_chunks, CANDIDATE_CHUNK).amax(dim=-1)  # (rows, num_chunks)
        chunks = maxima.topk(k, dim=-1).indices.sort(dim=-1).values  # (rows, k), in vocabulary order
        cols = (chunks.unsqueeze(-1) * CANDIDATE_CHUNK + _OFFSETS).view(rows, -1)  # (rows, k * chunk)
        if whole < vocab:  # and the tail
            cols = torch.cat([cols, torch.arange(whole, vocab).expand(rows, -1)], dim=1)
        ids = cols.gather(1, logits.gather(1, cols).topk(k, dim=-1).indices)
    return logits.softmax(dim=-1).gather(1, ids), ids


class _LogitsKeepingSampler:
    """The runner's sampler while tracing: the same call, with the logits kept for later."""

    def __init__(self, sampler) -> None:
        self.inner = sampler
        self.logits: torch.Tensor | None = None
        self.seconds = 0.0

    def __call__(self, logits, rows):
        start = time.perf_counter()
        output = self.inner(logits, rows)
        self.seconds += time.perf_counter() - start
        self.logits = logits
        return output

    def __getattr__(self, name):  # probabilities(), shared_generator: the speculative verifier's
        return getattr(self.inner, name)


class StepTracer:
    """Traces an LLMEngine's steps while acquired (see the module docstring)."""

    def __init__(self, engine, max_steps: int = 4096) -> None:
        self.engine = engine
        self.runner = engine.runner
        self.clock = StageClock(engine.runner.model)
        self.fusions = fusion_notes(engine.runner.model)
        self.steps: deque[StepRecord] = deque(maxlen=max_steps)
        self._num_steps = 0
        self._lock = threading.Lock()  # held by a traced step, and to attach or detach
        self._count_lock = threading.Lock()  # _num_holders and engine.tracer; held briefly
        self._records_lock = threading.Lock()  # readers of ``steps`` on other threads
        self._num_holders = 0
        self._sampler: _LogitsKeepingSampler | None = None

    # ------------------------------------------------------------------ on and off
    def acquire(self) -> None:
        """Trace from the next step on (counted: each acquire needs one release). Never
        waits for a step, so an event loop may call it."""
        with self._count_lock:
            self._num_holders += 1
            self.engine.tracer = self

    def release(self) -> None:
        """The last release detaches everything; it waits for a traced step to finish."""
        with self._count_lock:
            self._num_holders = max(0, self._num_holders - 1)
            if self._num_holders:
                return
        with self._lock, self._count_lock:
            if self._num_holders == 0:  # nobody acquired again meanwhile
                self._detach()

    @property
    def attached(self) -> bool:
        return self.clock.attached or self._sampler is not None

    def _attach(self) -> None:
        self.clock.attach()
        if self._sampler is None:
            self._sampler = _LogitsKeepingSampler(self.runner.sampler)
            self.runner.sampler = self._sampler

    def _detach(self) -> None:
        self.clock.detach()
        if self._sampler is not None:
            self.runner.sampler = self._sampler.inner
            self._sampler = None
        if self.engine.tracer is self:
            self.engine.tracer = None

    # ------------------------------------------------------------------ the step
    def execute(self, scheduled):
        """``runner.execute(scheduled)``, timed and recorded (the engine's step calls this
        instead while tracing)."""
        with self._lock:
            with self._count_lock:
                held = self._num_holders > 0
            if not held:  # released between the engine's check and here
                return self.runner.execute(scheduled)
            self._attach()
            self.clock.take()  # nothing from outside a step
            self.clock.take_experts()
            self._sampler.seconds, self._sampler.logits = 0.0, None
            start_time = time.monotonic()
            start = time.perf_counter()
            executed = self.runner.execute(scheduled)
            step_s = time.perf_counter() - start
            stages = self.clock.take()
            native = self.clock.native_calls > 0
            experts = self.clock.take_experts()
            stages["sampling"] = self._sampler.seconds
            stages["other"] = max(0.0, step_s - sum(stages.values()))
            logits, self._sampler.logits = self._sampler.logits, None
        if not scheduled.is_empty:
            self._record(scheduled, executed, logits, start_time, step_s, stages, native, experts)
        return executed

    def _record(self, scheduled, executed, logits, start_time, step_s, stages, native, experts) -> None:
        chunks = [ChunkRecord(c.request.request_id, c.request.index, c.start, c.num_new_tokens,
                              len(c.request.prompt_token_ids)) for c in scheduled.chunks]
        sampling = [record for record, c in zip(chunks, scheduled.chunks) if c.samples]
        for record, c in zip(sampling, [c for c in scheduled.chunks if c.samples]):
            record.sampling_kind = row_kind(c.request.params)
        for i, (record, c) in enumerate(zip(sampling, [c for c in scheduled.chunks if c.samples])):
            run = executed.runs.get(i)
            if c.draft_token_ids and run is not None:
                record.draft_token_ids = list(c.draft_token_ids)
                record.num_accepted = run.num_accepted
                record.emitted_token_ids = list(run.token_ids)
        # NOTE: a speculative step's logits rows are not one per chunk: no candidates then
        if logits is not None and sampling and not executed.runs:
            top_probs, top_ids = top_candidates(logits, TOP_CANDIDATES)
            top_probs, top_ids = top_probs.tolist(), top_ids.tolist()
            for i, record in enumerate(sampling):  # logits: (num_samples, vocab), chunk order
                record.token_id = executed.token_ids[i]
                record.top_ids, record.top_probs = top_ids[i], top_probs[i]
        blocks = self.engine.block_manager  # its usage() also counts the cached free blocks: not needed
        total = blocks.num_blocks
        with self._records_lock:
            self.steps.append(StepRecord(self._num_steps, start_time, step_s, stages, chunks,
                                         total - blocks.num_free_blocks, total, native, experts))
            self._num_steps += 1

    # ------------------------------------------------------------------ reading
    def steps_of(self, request_id: str) -> list[StepRecord]:
        """The recorded steps in which ``request_id`` had a chunk, oldest first."""
        with self._records_lock:
            return [s for s in self.steps if s.chunk_of(request_id) is not None]

    def all_steps(self) -> list[StepRecord]:
        with self._records_lock:
            return list(self.steps)


def tracer_of(engine) -> StepTracer:
    """The engine's one StepTracer, made on first use (attaching nothing yet). Kept on the
    engine itself: the tracer refers to its engine, so a table keyed weakly by engines (as
    this was) kept every traced engine, its weights and KV cache, alive for good."""
    if engine.engine_config.tensor_parallel_size > 1:
        raise ValueError("tracing runs in one process: tensor_parallel_size must be 1, got "
                         f"{engine.engine_config.tensor_parallel_size}")
    tracer = engine.__dict__.get("_step_tracer")
    if tracer is None:
        tracer = engine._step_tracer = StepTracer(engine)
    return tracer


@contextlib.contextmanager
def trace(engine):
    """``with trace(engine) as tracer:`` every step inside is recorded; nothing stays attached."""
    tracer = tracer_of(engine)
    tracer.acquire()
    try:
        yield tracer
    finally:
        tracer.release()
